"""Every backend at the edges of its input space: the same result (within the dtype's rounding) or the same refusal.

Each edge input below goes to every registered backend (one a plugin or conftest registers before collection
included; Triton ones interpreted on the CPU), eagerly and, for the layouts a compiled training step meets, under
torch.compile, and is compared with the baseline's outcome (the backend that materializes the logits). The boundary (grpo_kernels/validation.py) normalises
what every backend must see alike (a bias of another dtype, inference-mode tensors) and refuses the rest before
any backend runs; a backend's own limit is a declared one (BackendSpec.dtypes), refused there in one form.
"""

import functools
from contextlib import nullcontext

import pytest
import torch
from grpo_testing import make_problem, registered_backends, with_triton_interpreted

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, linear_logprobs
from grpo_kernels.backends import BASELINE_BACKEND, backend_names, get_backend

# Every registered backend but the baseline, each compared with the baseline.
BACKENDS = with_triton_interpreted([name for name in registered_backends() if name != BASELINE_BACKEND])
COMPILABLE = with_triton_interpreted([name for name in registered_backends(torch_compile=True)
                                      if name != BASELINE_BACKEND])
CONFIG = GRPOLossConfig(beta=0.04, entropy_coef=0.01)
# Agreement between backends: float32 / float64 to their rounding; 16-bit inputs to the rounding of 16-bit logits
# (the reference backend computes the logits in the input dtype, as the model's own head does; the streaming
# backends accumulate them in float32).
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}


def problem(dtype=torch.float32, B=2, T=3, **kwargs) -> dict:
    p = make_problem(0, B=B, T=T, H=8, V=16, dtype=dtype, **kwargs)
    return dict(hidden=p.hidden, weight=p.weight, bias=p.bias, completion_ids=p.completion_ids,
                completion_mask=p.completion_mask, advantages=p.advantages, old_logps=p.old_logps,
                ref_logps=p.ref_logps)


def replaced(**changes):
    def make():
        p = problem()
        for name, change in changes.items():
            p[name] = change(p[name])
        return p
    return make


def transposed_copy(x):
    """The same values in a non-contiguous layout (the last two dimensions stored transposed)."""
    return x.transpose(-1, -2).contiguous().transpose(-1, -2)


def every_other(x):
    """The same values as a strided view (every other element of a larger buffer)."""
    buffer = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)
    buffer[..., ::2] = x
    return buffer[..., ::2]


def packed(lengths):
    def make():
        n = sum(lengths)
        p = problem(B=1, T=max(n, 1))
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
        return dict(hidden=p["hidden"][0, :n], weight=p["weight"], bias=p["bias"],
                    completion_ids=p["completion_ids"][0, :n], completion_mask=None,
                    advantages=torch.linspace(-1.0, 1.0, len(lengths)), old_logps=p["old_logps"][0, :n],
                    ref_logps=p["ref_logps"][0, :n], cu_seqlens=cu)
    return make


def emptied(dims):
    def make():
        p = problem()
        return {k: v if k in ("weight", "bias") or v is None else v[(slice(None),) * dims + (slice(0, 0),)]
                if k != "advantages" or dims == 0 else v for k, v in p.items()}
    return make


def made_in_inference_mode():
    with torch.inference_mode():
        return problem()


def on_meta():
    return {k: v if v is None else v.to("meta") for k, v in problem().items()}


def mixed_devices():
    p = problem()
    p["advantages"] = p["advantages"].to("meta")
    return p


EDGES = {
    "float32": problem,
    "bfloat16": lambda: problem(torch.bfloat16),
    "float16": lambda: problem(torch.float16),
    "float64": lambda: problem(torch.float64),
    "bias_float64": replaced(bias=lambda b: b.double()),
    "bias_bfloat16": replaced(bias=lambda b: b.bfloat16()),
    "bias_int": replaced(bias=lambda b: b.long()),
    "weight_float64": replaced(weight=lambda w: w.double()),
    "advantages_float16": replaced(advantages=lambda a: a.half()),
    "old_float64_ref_float16": replaced(old_logps=lambda x: x.double(), ref_logps=lambda x: x.half()),
    "advantages_int": replaced(advantages=lambda a: a.long()),
    "mask_bool": replaced(completion_mask=lambda m: m.bool()),
    "mask_float": replaced(completion_mask=lambda m: m.float()),
    "mask_two": replaced(completion_mask=lambda m: m * 2),
    "ids_int32": replaced(completion_ids=lambda i: i.int()),
    "ids_float": replaced(completion_ids=lambda i: i.float()),
    "ids_out_of_range": replaced(completion_ids=lambda i: i + 16),
    "hidden_transposed": replaced(hidden=transposed_copy, completion_ids=transposed_copy,
                                  completion_mask=transposed_copy, old_logps=transposed_copy),
    "weight_transposed": replaced(weight=transposed_copy),
    "strided_views": replaced(hidden=every_other, weight=every_other, bias=every_other),
    "advantages_expanded": replaced(advantages=lambda a: a[:, None].expand(-1, 3)),
    "hidden_nan": replaced(hidden=lambda h: h.index_fill(2, torch.tensor([0]), float("nan"))),
    "empty_batch": emptied(0),
    "empty_completions": emptied(1),
    "all_masked": replaced(completion_mask=torch.zeros_like),
    "packed": packed([3, 2, 1]),
    "packed_with_empty_sequence": packed([3, 0, 2]),
    "packed_nothing": packed([0]),
    "inference_mode_tensors": made_in_inference_mode,
    "meta_device": on_meta,
    "mixed_devices": mixed_devices,
}
# What a compiled training step meets: the layouts and dtypes, not the refusals (those are checked eagerly). Plain
# float32 inputs under compile are test_compile.py's (every compilable backend, this CONFIG among its configs).
COMPILED = ["bias_float64", "hidden_transposed", "advantages_expanded", "all_masked", "packed"]
# How each call is made: with gradients, under no_grad, inside inference_mode.
MODES = {"grad": nullcontext, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


def outcome(backend: str, inputs: dict, mode: str, compiled: bool = False, route: str = "loss"):
    """('ok', loss or log-probs, gradients by name) or ('refused', error type, message)."""
    inputs = dict(inputs)
    grads = mode == "grad"
    leaves = {}
    for name in ("hidden", "weight", "bias"):
        x = inputs[name]
        if grads and isinstance(x, torch.Tensor) and x.is_floating_point() and x.device.type != "meta":
            with torch.inference_mode(False):
                inputs[name] = leaves[name] = x.detach().clone().requires_grad_()

    def call(inputs):
        if route == "logprobs":
            return linear_logprobs(inputs["hidden"], inputs["weight"], inputs["completion_ids"], bias=inputs["bias"],
                                   mask=inputs["completion_mask"], backend=backend, temperature=0.7)
        return fused_linear_grpo_loss(**inputs, config=CONFIG, backend=backend).loss

    if compiled:
        torch._dynamo.reset()  # each backend and input compiles afresh (one code object: no recompile limit)
    fn = torch.compile(call, backend="aot_eager", fullgraph=True) if compiled else call
    try:
        with MODES[mode]():
            value = fn(inputs)
            if grads and value.requires_grad:
                value.sum().backward()
    except (TypeError, ValueError, NotImplementedError) as exc:
        return ("refused", type(exc).__name__, str(exc))
    return ("ok", value.detach(), {name: leaf.grad for name, leaf in leaves.items()})


def declared_refusal(backend: str, inputs: dict):
    """The refusal a backend owes by its declaration (BackendSpec.dtypes), or None."""
    hidden = inputs["hidden"]
    dtype = str(hidden.dtype).removeprefix("torch.")
    if dtype in get_backend(backend).dtypes:
        return None
    others = ", ".join(name for name in backend_names(with_auto=False) if dtype in get_backend(name).dtypes)
    return ("refused", "TypeError", f"backend={backend!r} computes in {', '.join(get_backend(backend).dtypes)}, "
                                    f"got hidden of {hidden.dtype}; use backend='auto' or one of {others} for {dtype}")


def assert_backends_agree(outcomes: dict, inputs: dict) -> None:
    kept = {}
    for backend, result in outcomes.items():
        owed = declared_refusal(backend, inputs)
        if owed is not None:
            assert result == owed, f"{backend}: {result[:3]} instead of its declared refusal {owed}"
        else:
            kept[backend] = result
    kinds = {backend: result[0] for backend, result in kept.items()}
    assert len(set(kinds.values())) == 1, f"some backends refuse, others do not: {kept}"
    first, *others = kept.values()
    if first[0] == "refused":
        for backend, result in kept.items():
            assert result == first, f"{backend} refuses differently: {result} vs {first}"
        assert result[2] and "\n" not in result[2]
        return
    tolerance = TOLERANCE[inputs["hidden"].dtype]
    for backend, (_, value, grads) in kept.items():
        assert value.shape == first[1].shape and value.dtype == first[1].dtype, backend
        assert torch.isfinite(value).all(), f"{backend}: {value}"
        torch.testing.assert_close(value.double(), first[1].double(), atol=tolerance, rtol=tolerance,
                                   msg=lambda m: f"{backend}: {m}")
        assert grads.keys() == first[2].keys()
        for name, grad in grads.items():
            expected = first[2][name]
            assert (grad is None) == (expected is None), f"{backend}: d{name}"
            if grad is not None:
                assert grad.dtype == inputs[name].dtype and grad.shape == inputs[name].shape, f"{backend}: d{name}"
                scale = tolerance * max(1.0, float(expected.double().abs().amax())) if expected.numel() else tolerance
                torch.testing.assert_close(grad.double(), expected.double(), atol=scale, rtol=tolerance,
                                           msg=lambda m: f"{backend} d{name}: {m}")


@functools.lru_cache(maxsize=None)
def baseline_outcome(edge: str, mode: str, compiled: bool = False, route: str = "loss"):
    """The baseline's outcome, computed once per case and shared by every backend's test (read only)."""
    return outcome(BASELINE_BACKEND, EDGES[edge](), mode, compiled=compiled, route=route)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("edge", list(EDGES))
def test_every_backend_gives_the_same_loss_or_the_same_refusal(edge, mode, backend):
    if mode != "grad" and edge not in ("float32", "inference_mode_tensors", "packed", "bias_float64"):
        pytest.skip("the grad modes matter where tensors are saved for backward")
    outcomes = {BASELINE_BACKEND: baseline_outcome(edge, mode), backend: outcome(backend, EDGES[edge](), mode)}
    assert_backends_agree(outcomes, EDGES[edge]())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("edge", ["float32", "bias_float64", "bias_bfloat16", "float64", "inference_mode_tensors",
                                  "hidden_transposed", "strided_views", "all_masked", "empty_batch", "mask_two",
                                  "meta_device"])
def test_every_backend_gives_the_same_logprobs_or_the_same_refusal(edge, backend):
    outcomes = {BASELINE_BACKEND: baseline_outcome(edge, "grad", route="logprobs"),
                backend: outcome(backend, EDGES[edge](), "grad", route="logprobs")}
    assert_backends_agree(outcomes, EDGES[edge]())


@pytest.mark.parametrize("backend", COMPILABLE)
@pytest.mark.parametrize("edge", COMPILED)
def test_every_backend_agrees_under_torch_compile(edge, backend):
    compiled = {BASELINE_BACKEND: baseline_outcome(edge, "grad", compiled=True),
                backend: outcome(backend, EDGES[edge](), "grad", compiled=True)}
    assert_backends_agree(compiled, EDGES[edge]())
    # compiled = eager
    assert_backends_agree({**compiled, BASELINE_BACKEND: baseline_outcome(edge, "grad")}, EDGES[edge]())
