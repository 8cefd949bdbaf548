"""Tensors of a torch.func transform (vmap, grad) and FakeTensors outside torch.compile are refused by one line
naming the argument, alike on every backend and entry point, before any work.

Before: torch.func.grad failed inside autograd ("an autograd.Function ... must override the setup_context
staticmethod"), vmap at a data pointer ("Cannot access data pointer of Tensor that doesn't have storage"), a
FakeTensor in the value checks (DataDependentOutputException): each in torch's words, naming no argument.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

from grpo_kernels import fused_linear_grpo_loss, grpo_loss_from_logits, linear_logprobs

DERANDOMIZE = bool(os.environ.get("CI"))
B, T, H, V = 2, 3, 4, 7

# each entry point: its tensor arguments by name, and the float ones a gradient can be taken of
ENTRIES = {
    "logprobs": (("hidden", "weight", "targets"), ("hidden", "weight")),
    "loss": (("hidden", "weight", "completion_ids", "completion_mask", "advantages"), ("hidden", "weight")),
    "logits": (("logits", "completion_ids", "completion_mask", "advantages"), ("logits",)),
}


def _arguments(entry: str, gen: torch.Generator) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, V, (B, T), generator=gen)
    if entry == "logprobs":
        return dict(hidden=torch.randn(B, T, H, generator=gen), weight=torch.randn(V, H, generator=gen), targets=ids)
    common = dict(completion_ids=ids, completion_mask=torch.ones(B, T), advantages=torch.randn(B, generator=gen))
    if entry == "loss":
        return dict(hidden=torch.randn(B, T, H, generator=gen), weight=torch.randn(V, H, generator=gen), **common)
    return dict(logits=torch.randn(B, T, V, generator=gen), **common)


def _call(entry: str, backend: str, args: dict[str, torch.Tensor]) -> torch.Tensor:
    if entry == "logprobs":
        return linear_logprobs(args["hidden"], args["weight"], args["targets"], backend=backend).sum()
    if entry == "loss":
        return fused_linear_grpo_loss(args["hidden"], args["weight"], args["completion_ids"],
                                      args["completion_mask"], args["advantages"], backend=backend).loss
    return grpo_loss_from_logits(args["logits"], args["completion_ids"], args["completion_mask"], args["advantages"],
                                 backend="reference" if backend == "reference" else "auto").loss


@st.composite
def traced_cases(draw):
    entry = draw(st.sampled_from(sorted(ENTRIES)))
    names, float_names = ENTRIES[entry]
    transform = draw(st.sampled_from(["vmap", "grad", "fake"]))
    name = draw(st.sampled_from(float_names if transform == "grad" else names))
    return entry, transform, name, draw(st.sampled_from(["auto", "torch", "reference", "triton"])), draw(
        st.integers(0, 2**16))


@settings(max_examples=60, deadline=None, derandomize=DERANDOMIZE)
@given(traced_cases())
def test_a_transformed_or_fake_argument_is_refused_by_name(case):
    entry, transform, name, backend, seed = case
    if backend == "triton" and entry == "logits":
        backend = "auto"
    args = _arguments(entry, torch.Generator().manual_seed(seed))

    def with_argument(value: torch.Tensor) -> torch.Tensor:
        return _call(entry, backend, {**args, name: value})

    with pytest.raises(TypeError) as refused:
        if transform == "vmap":
            torch.vmap(with_argument)(torch.stack([args[name], args[name]]))
        elif transform == "grad":
            torch.func.grad(with_argument)(args[name])
        else:  # made in its mode, passed in outside it (a tensor from a traced model, say)
            with_argument(FakeTensorMode().from_tensor(args[name]))
    message = str(refused.value)
    kind = "a FakeTensor" if transform == "fake" else "a tensor of a torch.func transform"
    assert message.startswith(f"{name} is {kind}") and "\n" not in message, message


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_the_same_call_outside_the_transform_still_runs(backend):
    args = _arguments("loss", torch.Generator().manual_seed(0))
    hidden = args["hidden"].requires_grad_()
    _call("loss", backend, args).backward()
    assert hidden.grad is not None and torch.isfinite(hidden.grad).all()
