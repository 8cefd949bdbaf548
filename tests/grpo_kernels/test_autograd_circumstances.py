"""The circumstances autograd puts a loss call in, rather than its values: saved-tensor hooks around it
(save_on_cpu, activation checkpointing), forward-mode AD, torch's deterministic-algorithms warn-only mode, and
several Python threads. Each gives the plain call's answer or one clear refusal, alike on every backend.

Before: under any saved-tensor hooks the default backend's one-pass route failed in torch's words ("torch.func.{grad,
vjp, jacrev, hessian} don't yet support saved tensor hooks"); a dual tensor's tangent was dropped silently by every
fused backend (the jvp came back None); warn_only=True was refused as if it were an error mode; and the Triton
interpreter failed inside a kernel when two threads launched at once.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import forward_ad

from grpo_kernels import FusedLinearGRPOLoss, GRPOLossConfig, fused_linear_grpo_loss, linear_logprobs
from grpo_kernels.backends import BACKENDS as REGISTRY
from grpo_testing import device_of, make_problem, registered_backends, runs_triton, triton_device, \
    with_triton_interpreted

DERANDOMIZE = bool(os.environ.get("CI"))
BACKENDS = registered_backends()
FUSED = registered_backends(second_order=False)
CONFIGS = {  # the routes: one pass per token (GEMM, TMA), the epilogue (Triton), whole sequences, the two-step route
    "token_level": GRPOLossConfig(beta=0.04),
    "sequence_level": GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence", beta=0.04),
    "entropy_bonus": GRPOLossConfig(loss_type="bnpo", entropy_coef=0.01),
}


def _problem(backend: str, seed: int):
    return make_problem(seed, B=2, T=4, H=16, V=40, masked_rows=0, device=device_of(backend))


def _step(entry: str, backend: str, config: GRPOLossConfig, p, hidden, weight) -> torch.Tensor:
    if entry == "logprobs":
        return linear_logprobs(hidden, weight, p.completion_ids, backend=backend, mask=p.completion_mask).sum()
    if entry == "module":
        module = FusedLinearGRPOLoss(beta=config.beta, loss_type=config.loss_type, backend=backend,
                                     importance_sampling_level=config.importance_sampling_level)
        return module(hidden, weight, p.completion_ids, p.completion_mask, p.advantages,
                      ref_per_token_logps=p.ref_logps, old_per_token_logps=p.old_logps)[0]
    return fused_linear_grpo_loss(hidden, weight, p.completion_ids, p.completion_mask, p.advantages,
                                  old_logps=p.old_logps, ref_logps=p.ref_logps, config=config, backend=backend).loss


def _gradients(entry, backend, config, p, around) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    hidden, weight = p.hidden.clone().requires_grad_(), p.weight.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the sequence-level combinations TRL warns about
        loss = around(functools.partial(_step, entry, backend, config, p), hidden, weight)
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad


class _Counted:
    """A caller's own saved-tensor hooks: they must still see the tensors the loss saves for the backward."""

    def __init__(self) -> None:
        self.packed = 0

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        self.packed += 1
        return x

    @staticmethod
    def unpack(x: torch.Tensor) -> torch.Tensor:
        return x


def _hooked(kind: str, counter: _Counted):
    """`around(step, hidden, weight)`: the step run in the circumstance `kind`."""
    def around(step, hidden, weight):
        if kind.startswith("checkpoint"):
            return torch.utils.checkpoint.checkpoint(step, hidden, weight, use_reentrant=kind.endswith("reentrant"))
        contexts = {"save_on_cpu": lambda: [torch.autograd.graph.save_on_cpu()],
                    "hooks": lambda: [torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack)],
                    "nested": lambda: [torch.autograd.graph.save_on_cpu(),
                                       torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack)]}[kind]()
        with contextlib.ExitStack() as stack:
            for context in contexts:
                stack.enter_context(context)
            return step(hidden, weight)
    return around


def _hook_stack() -> list:
    """The thread's saved-tensor hooks, innermost first (popped and pushed back)."""
    autograd, stack = torch._C._autograd, []
    while (top := autograd._top_saved_tensors_default_hooks(True)) is not None:
        stack.append(top)
        autograd._pop_saved_tensors_default_hooks()
    for pack, unpack in reversed(stack):
        autograd._push_saved_tensors_default_hooks(pack, unpack)
    return stack


@settings(max_examples=40, deadline=None, derandomize=DERANDOMIZE)
@given(backend=st.sampled_from(BACKENDS), config=st.sampled_from(sorted(CONFIGS)),
       entry=st.sampled_from(["loss", "module", "logprobs"]),
       kind=st.sampled_from(["save_on_cpu", "hooks", "nested", "checkpoint", "checkpoint_reentrant"]),
       seed=st.integers(0, 2**16))
def test_saved_tensor_hooks_around_the_loss_change_nothing(backend, config, entry, kind, seed):
    p = _problem(backend, seed)
    plain = _gradients(entry, backend, CONFIGS[config], p, lambda step, hidden, weight: step(hidden, weight))
    counter = _Counted()
    with torch.autograd.graph.saved_tensors_hooks(_Counted.unpack, _Counted.unpack):  # the caller's outer hooks
        before = _hook_stack()
        hooked = _gradients(entry, backend, CONFIGS[config], p, _hooked(kind, counter))
        assert _hook_stack() == before  # set aside inside the passes, put back as they were
    for got, expected in zip(hooked, plain):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    if kind in ("hooks", "nested"):
        assert counter.packed > 0  # what the loss saves for the backward still goes through the caller's hooks


# ---- an input changed in place between the forward and the backward ------------------------------------------

MUTABLE = ("hidden", "weight", "bias", "advantages", "old_logps", "ref_logps", "completion_mask", "completion_ids")


@settings(max_examples=40, deadline=None, derandomize=DERANDOMIZE)
@given(backend=st.sampled_from(BACKENDS), config=st.sampled_from(sorted(CONFIGS)), changed=st.sampled_from(MUTABLE),
       seed=st.integers(0, 2**16))
def test_an_input_changed_in_place_before_the_backward_is_caught_or_never_read_again(backend, config, changed, seed):
    """Either autograd's version check refuses the backward, or the gradient is the forward's own: never one that
    mixes the old values with the new."""
    def gradients(change: bool):
        p = _problem(backend, seed)
        leaves = {name: getattr(p, name).clone().requires_grad_() for name in ("hidden", "weight", "bias")}
        inputs = {name: getattr(p, name).clone() for name in MUTABLE if name not in leaves}
        inputs.update(leaves)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loss = fused_linear_grpo_loss(
                inputs["hidden"], inputs["weight"], inputs["completion_ids"], inputs["completion_mask"],
                inputs["advantages"], bias=inputs["bias"], old_logps=inputs["old_logps"], ref_logps=inputs["ref_logps"],
                config=CONFIGS[config], backend=backend).loss
        if change:
            with torch.no_grad():
                x = inputs[changed]
                x.copy_(1 - x if changed == "completion_mask" else (x + 1) % 40 if changed == "completion_ids"
                        else x * 1.5 + 0.25)
        loss.backward()
        return [leaf.grad for leaf in leaves.values()]

    expected = gradients(change=False)
    try:
        got = gradients(change=True)
    except RuntimeError as exc:
        assert "modified by an inplace operation" in str(exc)
        return
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0)


# ---- forward-mode AD -------------------------------------------------------------------------------------------

FLOAT_INPUTS = ("hidden", "weight", "bias", "advantages", "old_logps", "ref_logps")


@settings(max_examples=30, deadline=None, derandomize=DERANDOMIZE)
@given(backend=st.sampled_from(["auto", *FUSED]), dual=st.sampled_from(FLOAT_INPUTS),
       entry=st.sampled_from(["loss", "module", "logprobs"]), seed=st.integers(0, 2**16))
def test_a_forward_mode_tangent_is_refused_naming_the_argument_where_it_would_be_dropped(backend, dual, entry, seed):
    p = _problem("triton" if runs_triton(backend) else "torch", seed)
    if entry == "logprobs" and dual not in ("hidden", "weight", "bias"):
        dual = "hidden"
    names = {"module": {"hidden": "_input", "weight": "lin_weight", "old_logps": "old_per_token_logps",
                        "ref_logps": "ref_per_token_logps"}}.get(entry, {})
    with forward_ad.dual_level():
        inputs = {name: getattr(p, name) for name in FLOAT_INPUTS}
        inputs[dual] = forward_ad.make_dual(inputs[dual], torch.ones_like(inputs[dual]))
        with pytest.raises(ValueError) as refused:
            if entry == "logprobs":
                linear_logprobs(inputs["hidden"], inputs["weight"], p.completion_ids, bias=inputs["bias"],
                                backend=backend)
            elif entry == "module":
                FusedLinearGRPOLoss(backend=backend)(
                    inputs["hidden"], inputs["weight"], p.completion_ids, p.completion_mask, inputs["advantages"],
                    bias=inputs["bias"], ref_per_token_logps=inputs["ref_logps"],
                    old_per_token_logps=inputs["old_logps"])
            else:
                fused_linear_grpo_loss(inputs["hidden"], inputs["weight"], p.completion_ids, p.completion_mask,
                                       inputs["advantages"], bias=inputs["bias"], old_logps=inputs["old_logps"],
                                       ref_logps=inputs["ref_logps"], config=CONFIGS["token_level"], backend=backend)
    message = str(refused.value)
    assert message.startswith(f"{names.get(dual, dual)} carries a forward-mode AD tangent") and "\n" not in message
    assert f"backend={backend!r}" in message and "'reference'" in message


def test_the_reference_backend_carries_a_forward_mode_tangent_exactly():
    p = make_problem(3, B=2, T=4, H=16, V=40, dtype=torch.float64)
    direction = torch.randn_like(p.hidden)

    def loss(hidden):
        return fused_linear_grpo_loss(hidden, p.weight, p.completion_ids, p.completion_mask, p.advantages,
                                      old_logps=p.old_logps.double(), ref_logps=p.ref_logps.double(),
                                      config=CONFIGS["token_level"], backend="reference").loss

    with forward_ad.dual_level():
        tangent = forward_ad.unpack_dual(loss(forward_ad.make_dual(p.hidden, direction))).tangent
    hidden = p.hidden.clone().requires_grad_()
    loss(hidden).backward()
    torch.testing.assert_close(tangent, (hidden.grad * direction).sum())


# ---- a batch of upstream gradients (autograd.grad(is_grads_batched=True), jacobian(vectorize=True)) ------------

@settings(max_examples=30, deadline=None, derandomize=DERANDOMIZE)
@given(backend=st.sampled_from(BACKENDS), config=st.sampled_from(sorted(CONFIGS)),
       entry=st.sampled_from(["loss", "module", "logprobs"]),
       scales=st.lists(st.sampled_from([1.0, -2.5, 0.0, 0.125]), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_a_batch_of_upstream_gradients_gives_each_its_scaled_gradient(backend, config, entry, scales, seed):
    """Each entry of a batched backward is the plain gradient times its upstream scale. Before: the one-pass route
    scaled its saved gradients in place, which vmap refused deep in autograd (aten::mul_ ... more elements)."""
    p = _problem(backend, seed)
    hidden, weight = p.hidden.clone().requires_grad_(), p.weight.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the sequence-level combinations TRL warns about
        loss = _step(entry, backend, CONFIGS[config], p, hidden, weight)
    plain = torch.autograd.grad(loss, [hidden, weight], retain_graph=True)
    batched = torch.autograd.grad(loss, [hidden, weight], grad_outputs=torch.tensor(scales, device=loss.device),
                                  is_grads_batched=True)
    for got, once in zip(batched, plain):
        expected = torch.stack([scale * once for scale in scales])
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


# ---- torch.use_deterministic_algorithms(True, warn_only=True) -----------------------------------------------------

@pytest.fixture()
def deterministic_warn_only():
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    torch.use_deterministic_algorithms(was, warn_only=warn_only)


@pytest.mark.parametrize("backend", with_triton_interpreted(BACKENDS))
def test_warn_only_deterministic_mode_warns_of_a_non_repeatable_backend_instead_of_refusing(
        backend, deterministic_warn_only):
    p = _problem("triton" if runs_triton(backend) else "torch", 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _step("loss", backend, CONFIGS["token_level"], p, p.hidden.clone().requires_grad_(), p.weight).backward()
    ours = [w for w in caught if "use_deterministic_algorithms(True, warn_only=True)" in str(w.message)]
    assert len(ours) == (0 if REGISTRY[backend].deterministic else 1), [str(w.message) for w in caught]
    assert all(w.filename == __file__ for w in ours)  # attributed to the caller's line


# ---- several Python threads -----------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", with_triton_interpreted(BACKENDS))
def test_calls_from_several_threads_give_each_call_its_own_answer(backend):
    device = triton_device() if runs_triton(backend) else "cpu"
    problems = [make_problem(seed, B=2, T=4, H=16, V=40, device=device) for seed in range(3)]
    configs = list(CONFIGS.values())
    alone = [_gradients("loss", backend, configs[i], p, lambda step, h, w: step(h, w)) for i, p in enumerate(problems)]
    results, errors = {}, []

    def run(i: int) -> None:
        try:
            for _ in range(2):
                results[i] = _gradients("loss", backend, configs[i], problems[i], lambda step, h, w: step(h, w))
        except Exception as exc:  # reported below, with the thread's own error
            errors.append(repr(exc))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    exact = REGISTRY[backend].deterministic  # the others are not bitwise repeatable run to run, threads or not
    for i, expected in enumerate(alone):
        for got, want in zip(results[i], expected):
            torch.testing.assert_close(got, want, rtol=0 if exact else 1e-5, atol=0 if exact else 1e-6)
