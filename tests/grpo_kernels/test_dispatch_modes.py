"""A caller's Python dispatch mode around a loss call: FlopCounterMode (MFU accounting), a TorchDispatchMode of their
own, torch.autograd.graph.allow_mutation_on_saved_tensors(). Each gives the plain call's loss and gradients on every
backend and entry point, and FlopCounterMode counts the same FLOPs on every backend: the reference's matmuls.

Before: under any of these modes the default backend (and triton_tma) failed deep inside the objective with
"NotImplementedError: Cannot access storage of TensorWrapper" (torch.func inside a custom op, run from the mode's
handler), and FlopCounterMode counted 0 FLOPs for the LM head on every backend but the reference.
"""

from __future__ import annotations

import os
import warnings
from typing import Callable

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from grpo_kernels import FusedLinearGRPOLoss, GRPOLossConfig, fused_linear_grpo_loss, linear_logprobs
from grpo_testing import device_of, make_problem, registered_backends

DERANDOMIZE = bool(os.environ.get("CI"))
BACKENDS = registered_backends()
CONFIGS = {  # the routes: one pass per token (GEMM, TMA), the epilogue (Triton), whole sequences, the two-step route
    "token_level": GRPOLossConfig(beta=0.04),
    "sequence_level": GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence", beta=0.04),
    "entropy_bonus": GRPOLossConfig(loss_type="bnpo", entropy_coef=0.01),
}


class _Passing(TorchDispatchMode):
    """A caller's own mode: sees every op and changes nothing."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


MODES: dict[str, Callable[[], object]] = {
    "flop_counter": lambda: FlopCounterMode(display=False),
    "own_mode": _Passing,
    "allow_mutation_on_saved_tensors": torch.autograd.graph.allow_mutation_on_saved_tensors,
    "none": lambda: torch.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x),  # the plain call
}


def _step(entry: str, backend: str, config: GRPOLossConfig, p, hidden, weight, bias) -> torch.Tensor:
    if entry == "logprobs":
        return linear_logprobs(hidden, weight, p.completion_ids, bias=bias, backend=backend,
                               mask=p.completion_mask).sum()
    if entry == "module":
        module = FusedLinearGRPOLoss(beta=config.beta, loss_type=config.loss_type, backend=backend,
                                     importance_sampling_level=config.importance_sampling_level,
                                     entropy_coef=config.entropy_coef)
        return module(hidden, weight, p.completion_ids, p.completion_mask, p.advantages, bias=bias,
                      ref_per_token_logps=p.ref_logps, old_per_token_logps=p.old_logps)[0]
    return fused_linear_grpo_loss(hidden, weight, p.completion_ids, p.completion_mask, p.advantages, bias=bias,
                                  old_logps=p.old_logps, ref_logps=p.ref_logps, config=config, backend=backend).loss


def _run(mode: str, entry: str, backend: str, config: GRPOLossConfig, p, grads: bool = True):
    """(loss, dhidden, dweight, dbias) of one step (forward and backward) under `mode`; the mode object."""
    leaves = [x.clone().requires_grad_(grads) for x in (p.hidden, p.weight, p.bias)]
    with warnings.catch_warnings(), MODES[mode]() as context:
        warnings.simplefilter("ignore")  # the sequence-level combinations TRL warns about
        loss = _step(entry, backend, config, p, *leaves)
        if grads:
            loss.backward()
    return (loss.detach(), *(x.grad for x in leaves)), context


@settings(max_examples=25, deadline=None, derandomize=DERANDOMIZE)
@given(backend=st.sampled_from(BACKENDS), config=st.sampled_from(sorted(CONFIGS)),
       entry=st.sampled_from(["loss", "module", "logprobs"]), mode=st.sampled_from(sorted(set(MODES) - {"none"})),
       seed=st.integers(0, 2**16))
def test_a_dispatch_mode_around_the_call_changes_no_loss_and_no_gradient(backend, config, entry, mode, seed):
    p = make_problem(seed, B=2, T=4, H=16, V=40, device=device_of(backend))
    plain, _ = _run("none", entry, backend, CONFIGS[config], p)
    moded, _ = _run(mode, entry, backend, CONFIGS[config], p)
    for got, expected in zip(moded, plain):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@settings(max_examples=20, deadline=None, derandomize=DERANDOMIZE)
@given(backend=st.sampled_from(BACKENDS), config=st.sampled_from(sorted(CONFIGS)),
       entry=st.sampled_from(["loss", "module", "logprobs"]), grads=st.booleans(), seed=st.integers(0, 2**16))
def test_flop_counter_mode_counts_the_reference_matmuls_on_every_backend(backend, config, entry, grads, seed):
    """The head's FLOPs as the reference's plain matmuls count them (2 N H V forward, as much again per gradient),
    whichever backend runs the step: the fused ones' recomputation is not model work. The bias gradient's column
    sums are the one difference a backend may show: the waves of whole sequences take them as a matrix-vector
    product (q^T g over the N rows through the head, 2 N V: a 1 / H of one head matmul), the reference as a sum, which FlopCounterMode does not count."""
    B, T, H, V = 2, 4, 16, 40
    p = make_problem(seed, B=B, T=T, H=H, V=V, device=device_of(backend))
    _, reference = _run("flop_counter", entry, "reference", CONFIGS[config], p, grads)
    _, counted = _run("flop_counter", entry, backend, CONFIGS[config], p, grads)
    assert reference.get_total_flops() > 0
    head_rows = int((p.completion_mask != 0).sum())  # the rows through the head: padding is dropped (layout.py)
    bias_sums = 2 * head_rows * V if grads and p.bias is not None else 0
    assert counted.get_total_flops() - reference.get_total_flops() in (0, bias_sums), \
        (counted.get_flop_counts(), reference.get_flop_counts())
