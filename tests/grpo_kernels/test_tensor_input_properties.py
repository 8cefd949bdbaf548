"""Property test of the loss library's TENSOR arguments and their relations, at every public entry point (the loss
padded and packed, the log-probs, the loss from logits, the Liger-compatible module): strided, transposed,
stride-0, offset views; every dtype against its partner's; meta tensors; numpy arrays in place of tensors; gradients
asked of constants; shapes that would broadcast; ids, mask values and non-finite values at scored and padded
positions; batches, sequences and vocabularies of 0 and 1.

Each draw is either accepted with the answer of the library's float64 reference (backend="reference" on contiguous
float64 copies of the same values) or refused before any GEMM by one TypeError / ValueError line that comes from the
boundary and names the argument as the caller wrote it (the module's `lin_weight`, not `weight`)."""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode
from torch.testing._internal.two_tensor import TwoTensor

import grpo_kernels
from grpo_kernels import FusedLinearGRPOLoss, GRPOLossConfig, fused_linear_grpo_loss, grpo_loss_from_logits, \
    linear_logprobs
from grpo_testing import with_triton_interpreted

DERANDOMIZE = bool(os.environ.get("CI"))
BOUNDARY = {"validation.py", "api.py", "module.py", "config.py"}  # where a refusal may come from
HEAD, CONSTANT, IDS, MASK, COUNT, OFFSETS, KEPT = "head", "constant", "ids", "mask", "count", "offsets", "kept"
ADVANTAGES = "advantages"
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64, torch.bool, torch.complex64]
# the dtypes each kind of argument takes (a head argument: the float dtype of its partner, checked apart)
TAKES = {CONSTANT: {torch.float16, torch.bfloat16, torch.float32, torch.float64},
         IDS: {torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64},
         MASK: set(DTYPES) - {torch.complex64},
         COUNT: set(DTYPES) - {torch.bool, torch.complex64},
         OFFSETS: {torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64},
         KEPT: {torch.int32, torch.int64},
         # integer advantages (+1 / -1 rewards as they are) are taken as TRL and Liger take them, as float32
         ADVANTAGES: {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
                      torch.int16, torch.int32, torch.int64}}


class _Work(TorchFunctionMode):
    """Records whether a GEMM, a softmax or one of the library's own operators was called: the work a refusal must
    precede (the checks' reductions over the inputs are not work). A function mode, not a dispatch mode: the
    objective's functorch transforms work under it."""

    WORK = {"matmul", "mm", "addmm", "bmm", "baddbmm", "linear", "log_softmax", "logsumexp", "__matmul__",
            "__rmatmul__"}

    def __init__(self):
        super().__init__()
        self.ran = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name.split(".")[0] in self.WORK or getattr(func, "namespace", None) == "grpo_kernels":
            self.ran.append(str(func))
        return func(*args, **(kwargs or {}))


@dataclass
class Call:
    """One entry point's valid call: the caller's arguments by name, what kind each is, the shapes each may have,
    which positions are scored, and how to run it."""

    args: dict
    kinds: dict
    shapes: dict  # name -> accepted shapes (None: any shape is fine for the argument's own check)
    partner: dict  # head argument -> the head argument whose dtype it must match
    scored: dict  # name -> bool tensor of its shape: where a non-finite value is read
    run: Callable  # (args, backend) -> (outputs, {name: differentiable argument})
    vocab: int = 0

    def __repr__(self) -> str:  # hypothesis prints the failing draw: shapes and dtypes, not every element
        shown = {name: (f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)} on {x.device}"
                        if isinstance(x, torch.Tensor) else type(x).__name__) for name, x in self.args.items()}
        return f"Call({shown})"


def _config(loss_type: str) -> GRPOLossConfig:
    return GRPOLossConfig(loss_type=loss_type, beta=0.04)


def _base(gen, B, T, H, V):
    mask = (torch.rand(B, T, generator=gen) > 0.3).float()
    ids = torch.randint(0, V, (B, T), generator=gen)
    return dict(hidden=torch.randn(B, T, H, generator=gen), weight=torch.randn(V, H, generator=gen),
                bias=torch.randn(V, generator=gen), ids=ids, mask=mask, advantages=torch.randn(B, generator=gen),
                old=-torch.rand(B, T, generator=gen) - 0.1, ref=-torch.rand(B, T, generator=gen) - 0.1,
                ratio=torch.rand(B, T, generator=gen) + 0.5,
                kept=torch.stack([ids, torch.where(ids + 1 < V, ids + 1, -1)], -1))


def _loss_run(loss_type: str):
    """run(args, backend) of fused_linear_grpo_loss, padded or packed: (loss, logps), no extra outputs."""
    def run(args, backend):
        a = dict(args)
        out = fused_linear_grpo_loss(a.pop("hidden"), a.pop("weight"), a.pop("completion_ids"),
                                     a.pop("completion_mask"), a.pop("advantages"), config=_config(loss_type),
                                     backend=backend, **a)
        return (out.loss, out.logps), {}
    return run


def _loss_call(gen, B, T, H, V, loss_type) -> Call:
    b = _base(gen, B, T, H, V)
    scored = b["mask"] != 0
    args = dict(hidden=b["hidden"], weight=b["weight"], completion_ids=b["ids"], completion_mask=b["mask"],
                advantages=b["advantages"], bias=b["bias"], old_logps=b["old"], ref_logps=b["ref"],
                importance_ratio=b["ratio"], num_items_in_batch=scored.sum() + 1.0, kept_token_ids=b["kept"])

    run = _loss_run(loss_type)

    return Call(args, dict(hidden=HEAD, weight=HEAD, bias=HEAD, completion_ids=IDS, completion_mask=MASK,
                           advantages=ADVANTAGES, old_logps=CONSTANT, ref_logps=CONSTANT, importance_ratio=CONSTANT,
                           num_items_in_batch=COUNT, kept_token_ids=KEPT),
                dict(completion_ids=[(B, T)], completion_mask=[(B, T)], advantages=[(B,), (B, 1), (B, T)],
                     old_logps=[(B, T)], ref_logps=[(B, T)], importance_ratio=[(B, T), (B, 1)], bias=[(V,)],
                     num_items_in_batch=None, kept_token_ids=None),
                dict(hidden="weight", weight="hidden"),
                dict(advantages=scored.any(-1), old_logps=scored, ref_logps=scored, importance_ratio=scored,
                     completion_ids=scored),
                run, V)


def _packed_call(gen, B, T, H, V, loss_type) -> Call:
    S = max(B, 1)
    lengths = torch.randint(0, T + 1, (S,), generator=gen)
    N = int(lengths.sum())
    b = _base(gen, 1, N, H, V)
    mask = b["mask"][0]
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    scored = mask != 0
    sequence_scored = torch.tensor([bool(scored[int(cu[s]):int(cu[s + 1])].any()) for s in range(S)])
    args = dict(hidden=b["hidden"][0], weight=b["weight"], completion_ids=b["ids"][0], completion_mask=mask,
                advantages=torch.randn(S, generator=gen), bias=b["bias"], old_logps=b["old"][0],
                ref_logps=b["ref"][0], importance_ratio=b["ratio"][0], cu_seqlens=cu)

    run = _loss_run(loss_type)

    return Call(args, dict(hidden=HEAD, weight=HEAD, bias=HEAD, completion_ids=IDS, completion_mask=MASK,
                           advantages=ADVANTAGES, old_logps=CONSTANT, ref_logps=CONSTANT, importance_ratio=CONSTANT,
                           cu_seqlens=OFFSETS),
                dict(completion_ids=[(N,)], completion_mask=[(N,)], advantages=[(S,), (N,)], old_logps=[(N,)],
                     ref_logps=[(N,)], importance_ratio=[(N,)], bias=[(V,)], cu_seqlens=[(S + 1,)]),
                dict(hidden="weight", weight="hidden"),
                dict(advantages=sequence_scored, old_logps=scored, ref_logps=scored, importance_ratio=scored,
                     completion_ids=scored),
                run, V)


def _logprobs_call(gen, B, T, H, V, loss_type) -> Call:
    b = _base(gen, B, T, H, V)
    scale = torch.randn(B, T, generator=gen)  # the log-probs' cotangent: every position's gradient counts
    args = dict(hidden=b["hidden"], weight=b["weight"], targets=b["ids"], bias=b["bias"], mask=b["mask"],
                kept_token_ids=b["kept"])

    def run(args, backend):
        a = dict(args)
        logps = linear_logprobs(a.pop("hidden"), a.pop("weight"), a.pop("targets"), backend=backend, **a)
        return ((logps * scale).sum(), logps), {}

    return Call(args, dict(hidden=HEAD, weight=HEAD, bias=HEAD, targets=IDS, mask=MASK, kept_token_ids=KEPT),
                dict(targets=[(B, T)], mask=[(B, T)], bias=[(V,)], kept_token_ids=None),
                dict(hidden="weight", weight="hidden"), dict(targets=b["mask"] != 0), run, V)


def _logits_call(gen, B, T, H, V, loss_type) -> Call:
    b = _base(gen, B, T, H, V)
    scored = b["mask"] != 0
    args = dict(logits=b["hidden"] @ b["weight"].T, completion_ids=b["ids"], completion_mask=b["mask"],
                advantages=b["advantages"], old_logps=b["old"], ref_logps=b["ref"], importance_ratio=b["ratio"],
                num_items_in_batch=scored.sum() + 1.0)

    def run(args, backend):
        a = dict(args)
        out = grpo_loss_from_logits(a.pop("logits"), a.pop("completion_ids"), a.pop("completion_mask"),
                                    a.pop("advantages"), config=_config(loss_type), backend=backend, **a)
        return (out.loss, out.logps), {}

    return Call(args, dict(logits=HEAD, completion_ids=IDS, completion_mask=MASK, advantages=ADVANTAGES,
                           old_logps=CONSTANT, ref_logps=CONSTANT, importance_ratio=CONSTANT,
                           num_items_in_batch=COUNT),
                dict(completion_ids=[(B, T)], completion_mask=[(B, T)], advantages=[(B,), (B, 1), (B, T)],
                     old_logps=[(B, T)], ref_logps=[(B, T)], importance_ratio=[(B, T), (B, 1)],
                     num_items_in_batch=None),
                {}, dict(advantages=scored.any(-1), old_logps=scored, ref_logps=scored, importance_ratio=scored,
                         completion_ids=scored),
                run, V)


def _module_call(gen, B, T, H, V, loss_type) -> Call:
    b = _base(gen, B, T, H, V)
    scored = b["mask"] != 0
    ref_weight = torch.randn(V, H, generator=gen)
    args = dict(_input=b["hidden"], lin_weight=b["weight"], selected_token_ids=b["ids"], attention_mask=b["mask"],
                advantages=b["advantages"], bias=b["bias"], old_per_token_logps=b["old"],
                ref_input=torch.randn(B, T, H, generator=gen), ref_weight=ref_weight,
                ref_bias=torch.randn(V, generator=gen), vllm_is_ratio=b["ratio"])

    def run(args, backend):
        module = FusedLinearGRPOLoss(beta=0.04, loss_type=loss_type, backend=backend)
        a = dict(args)
        loss, _ = module(a.pop("_input"), a.pop("lin_weight"), a.pop("selected_token_ids"), a.pop("attention_mask"),
                         a.pop("advantages"), **a)
        return (loss,), {}

    return Call(args, dict(_input=HEAD, lin_weight=HEAD, bias=HEAD, selected_token_ids=IDS, attention_mask=MASK,
                           advantages=ADVANTAGES, old_per_token_logps=CONSTANT, ref_input=HEAD, ref_weight=HEAD,
                           ref_bias=HEAD, vllm_is_ratio=CONSTANT),
                dict(attention_mask=[(B, T)], advantages=[(B,), (B, 1), (B, T)], old_per_token_logps=[(B, T)],
                     vllm_is_ratio=[(B,), (B, 1), (B, T)], bias=[(V,)], ref_bias=[(V,)]),
                dict(_input="lin_weight", lin_weight="_input", ref_input="ref_weight", ref_weight="ref_input"),
                dict(advantages=scored.any(-1), old_per_token_logps=scored, vllm_is_ratio=scored,
                     selected_token_ids=scored),
                run, V)


ENTRIES = {"loss": _loss_call, "packed": _packed_call, "logprobs": _logprobs_call, "logits": _logits_call,
           "module": _module_call}


# ---- the faults: each returns the new value and what a correct boundary does with it -------------------------------
ACCEPT, REFUSE, AS_REFERENCE = "accept", "refuse", "as the reference"


def _with_storage_offset(x: torch.Tensor) -> torch.Tensor:
    storage = torch.zeros(x.numel() + 3, dtype=x.dtype)
    storage[3:] = x.reshape(-1)
    return storage[3:].view(x.shape)


LAYOUTS = {
    "transposed": lambda x: x.transpose(0, 1).contiguous().transpose(0, 1) if x.dim() >= 2 else x,
    "every other element": lambda x: torch.stack([x, torch.zeros_like(x)], -1)[..., 0],
    "storage offset": _with_storage_offset,
    # a 0-d tensor has no dimension to reverse (permute() needs one)
    "reversed dims": lambda x: x.permute(*reversed(range(x.dim()))).contiguous().permute(*reversed(range(x.dim())))
    if x.dim() else x,
    "stride 0 (expanded)": lambda x: x[:1].expand(x.shape) if x.dim() and x.shape[0] else x,
}
SHAPES = {
    "last dim dropped": lambda x: x[..., 0] if x.dim() and x.shape[-1] else x.sum(-1),
    "unit dim added": lambda x: x[..., None],
    "first dim 1": lambda x: x[:1],
    "last dim 1": lambda x: x[..., :1],
    "dims swapped": lambda x: x.transpose(0, 1) if x.dim() >= 2 else x[None],
}


def _poison(x: torch.Tensor, where: torch.Tensor, value: float) -> Optional[torch.Tensor]:
    if not bool(where.any()):
        return None
    x = x.clone()
    x[tuple(torch.nonzero(where)[0].tolist())] = value
    return x


@st.composite
def faulty_calls(draw, entries=tuple(ENTRIES), kinds=("layout", "dtype", "meta", "array", "grad", "shape",
                                                       "value", "transposed head")):
    entry = draw(st.sampled_from(entries))
    B, T = draw(st.sampled_from([0, 1, 2, 2])), draw(st.sampled_from([0, 1, 3, 3]))  # mostly non-empty
    H, V = draw(st.sampled_from([3, 5])), draw(st.sampled_from([1, 2, 4, 7]))  # never V == H: a [H, V] head shows
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    call = ENTRIES[entry](gen, B, T, H, V, draw(st.sampled_from(["dapo", "grpo"])))
    kind = draw(st.sampled_from(kinds))
    names = [n for n, v in call.args.items() if isinstance(v, torch.Tensor)]
    if kind == "transposed head":
        names = [n for n in names if n.endswith("weight")]  # [V, H] with V != H: its .T cannot pass
    elif kind == "grad":
        names = [n for n in names if call.kinds[n] in (CONSTANT, ADVANTAGES, MASK, COUNT)]
    elif kind == "shape":
        names = [n for n in names if call.shapes.get(n, ())]
    elif kind == "value":
        names = [n for n in names if call.kinds[n] in (IDS, MASK) or n in call.scored]
    if not names:
        return call, entry, "none", None, AS_REFERENCE
    name = draw(st.sampled_from(names))
    x, argument_kind = call.args[name], call.kinds[name]
    expect = REFUSE
    if kind == "layout":
        how = draw(st.sampled_from(sorted(LAYOUTS)))
        new, expect, kind = LAYOUTS[how](x), AS_REFERENCE, f"layout: {how}"
    elif kind == "dtype":
        dtype = draw(st.sampled_from(DTYPES))
        new = x.to(dtype)
        if argument_kind == HEAD:
            partner = call.partner.get(name)
            ok = dtype.is_floating_point and (partner is None or call.args[partner].dtype == dtype)
        else:
            ok = dtype in TAKES[argument_kind]
        expect = AS_REFERENCE if ok else REFUSE
        kind = f"dtype: {dtype}"
    elif kind == "meta":
        new = x.to("meta")
    elif kind == "array":  # a count's list form is a plain number, which it takes: its array form is not
        new = x.numpy() if argument_kind == COUNT or draw(st.booleans()) else x.tolist()
    elif kind == "grad":
        new = x.float().requires_grad_()
    elif kind == "transposed head":
        new = x.T
    elif kind == "wrapper subclass":  # a __torch_dispatch__ subclass (as DTensor, torchao's): its data unreadable
        new = TwoTensor(x, x.clone())
    elif kind == "shape":
        how = draw(st.sampled_from(sorted(SHAPES)))
        new = SHAPES[how](x)
        accepted = call.shapes[name]
        expect = AS_REFERENCE if accepted is None or tuple(new.shape) in accepted else REFUSE
        kind = f"shape: {how} {list(x.shape)} -> {list(new.shape)}"
    else:  # value
        if argument_kind == IDS:
            value = draw(st.sampled_from([-1, call.vocab, call.vocab + 5, -(2**40)]))
            new = x.clone().flatten()
            if new.numel() == 0:
                return call, entry, "none", None, AS_REFERENCE
            index = draw(st.integers(0, new.numel() - 1))
            new[index] = value
            new = new.view(x.shape)
            # an id where the mask is 0 is never read (-100, HF's ignore index): taken as Liger and TRL take it
            expect = REFUSE if bool(call.scored[name].flatten()[index]) else AS_REFERENCE
        elif argument_kind == MASK:
            value = draw(st.sampled_from([2.0, -1.0, 0.5, float("nan"), float("inf")]))
            new = _poison(x, torch.ones_like(x, dtype=torch.bool), value)
        else:
            value = draw(st.sampled_from([float("nan"), float("inf"), float("-inf")]))
            scored = draw(st.booleans())
            where = call.scored[name] if scored else ~call.scored[name]
            new = _poison(x, where, value)
            expect = REFUSE if scored else AS_REFERENCE
        if new is None:
            return call, entry, "none", None, AS_REFERENCE
        kind = f"value: {value}"
    call.args[name] = new
    return call, entry, kind, name, expect


def _leaves(call: Call, args: dict, dtype: Optional[torch.dtype] = None) -> tuple[dict, dict]:
    """The arguments with the head's float tensors made leaves that ask a gradient (in `dtype` and contiguous for
    the reference), the others as they are (contiguous for the reference)."""
    made, leaves = {}, {}
    for name, x in args.items():
        if isinstance(x, torch.Tensor) and x.device.type != "meta" and dtype is not None:
            x = x.detach().contiguous()
            if call.kinds[name] == HEAD and x.is_floating_point():
                x = x.to(dtype)
        if (isinstance(x, torch.Tensor) and call.kinds[name] == HEAD and x.is_floating_point()
                and x.device.type != "meta" and name not in ("ref_input", "ref_weight", "ref_bias")):
            x = x.detach().requires_grad_()
            leaves[name] = x
        made[name] = x
    return made, leaves


def _outcome(call: Call, backend: str, dtype: Optional[torch.dtype] = None):
    args, leaves = _leaves(call, call.args, dtype)
    work = _Work()
    try:
        with work:
            outputs, _ = call.run(args, backend)
    except (TypeError, ValueError) as exc:
        return "refused", exc, work.ran
    grads = torch.autograd.grad(outputs[0], list(leaves.values()), allow_unused=True) if leaves and \
        outputs[0].requires_grad else [None] * len(leaves)
    return "accepted", ([o.detach() for o in outputs], dict(zip(leaves, grads))), work.ran


def _assert_refused_by_the_boundary(exc: Exception, name: str, ran: list) -> None:
    message = str(exc)
    assert name in message and "\n" not in message and len(message) < 600, (name, message)
    origin = Path(traceback.extract_tb(exc.__traceback__)[-1].filename)
    assert origin.parent == Path(grpo_kernels.__file__).parent and origin.name in BOUNDARY, (origin, message)
    assert not ran, f"refused {name} after work had started: {ran[:3]} ({message})"


def _assert_matches(actual, expected) -> None:
    (outputs, grads), (ref_outputs, ref_grads) = actual, expected
    for got, want in zip(outputs, ref_outputs):
        torch.testing.assert_close(got.double(), want.double(), rtol=2e-4, atol=2e-5)
    for name, want in ref_grads.items():
        got = grads.get(name)
        if want is None or got is None:
            assert (want is None or not bool(want.any())) and (got is None or not bool(got.any())), name
            continue
        scale = float(want.abs().max()) if want.numel() else 0.0
        # a gradient held in a 16-bit leaf's dtype (a bf16 bias beside float32 inputs) is rounded once on each side:
        # the two may land one unit in its last place apart
        rtol = max(2e-4, torch.finfo(got.dtype).eps)
        torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=rtol * (1 + scale))


def check_fault(backend: str, case) -> None:
    call, entry, kind, name, expect = case
    outcome, result, ran = _outcome(call, backend)
    event(f"{entry}: {kind.split(':')[0]} {outcome}")  # the mix of faults drawn (--hypothesis-show-statistics)
    if expect == REFUSE:
        assert outcome == "refused", f"{entry}: accepted {name} with {kind}"
        _assert_refused_by_the_boundary(result, name, ran)
        return
    reference_outcome, reference_result, _ = _outcome(call, "reference", torch.float64)
    if reference_outcome == "refused":  # e.g. a stride-0 row of kept sets that lacks a target: refused alike
        assert outcome == "refused", f"{entry}: accepted {name} with {kind}, which the reference refuses " \
                                     f"({reference_result})"
        assert str(result) == str(reference_result) or name in str(result), (str(result), str(reference_result))
        _assert_refused_by_the_boundary(result, name or "", ran)
        return
    assert outcome == "accepted", f"{entry}: refused {name} with {kind}, which the reference accepts: {result}"
    _assert_matches(result, reference_result)


COMMON = dict(deadline=None, derandomize=DERANDOMIZE, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.filterwarnings("ignore:.*importance_sampling_level:UserWarning")
@settings(max_examples=250, **COMMON)
@given(st.sampled_from(["torch", "gemm"]), faulty_calls())
def test_every_tensor_fault_is_answered_as_the_reference_or_refused_naming_the_argument(backend, case):
    check_fault(backend, case)


# The Triton kernels, under the interpreter: the faults that reach a kernel (layouts, dtypes, sizes of 0 and 1).
@pytest.mark.filterwarnings("ignore:.*importance_sampling_level:UserWarning")
@pytest.mark.parametrize("backend", with_triton_interpreted(["triton", "triton_atomic", "triton_tma"]))
@settings(max_examples=12, **COMMON)
@given(case=faulty_calls(entries=("loss", "logprobs", "module"), kinds=("layout", "dtype", "grad")))
def test_the_triton_kernels_take_every_layout_and_refuse_the_same_faults(backend, case):
    check_fault(backend, case)


# A tensor subclass with its own __torch_dispatch__ (TwoTensor here; DTensor, torchao's wrappers) in place of any
# tensor argument. Before: the finiteness scan's .tolist() failed ("not supported for tensor subclasses"), the GEMM
# path failed at the storage, and the torch backend returned the subclass.
@settings(max_examples=40, **COMMON)
@given(st.sampled_from(["torch", "gemm"]), faulty_calls(kinds=("wrapper subclass",)))
def test_a_tensor_subclass_with_its_own_dispatch_is_refused_naming_the_argument(backend, case):
    check_fault(backend, case)
