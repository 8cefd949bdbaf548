"""`backend="auto"`: per operation and device, the backend the cost model (cost_model/) predicts fastest within a
memory budget, among the registry's entries that declare `auto=True` and support the call (backends/__init__.py),
and for a backend streaming through a workspace, the workspace the model predicts fastest within that budget.
Without a budget from the call, the memory of the usual fused head (16-bit logits tiles) is preferred while the
time it gives up stays within PREFERRED_MEMORY_TIME_TOLERANCE.

The four operations the model tells apart: the token-level loss (the objective closed-form per token: one pass),
the sequence-level loss (the statistics first, the gradients in a second pass), the frozen head (no dW) and
no-grad log-probs; a backend that would run a token-level call in two steps (its route does not apply) is
charged as the sequence-level loss. A workspace backend is a candidate only with a budget that holds its minimum
useful workspace (one GEMM tile of rows per wave): below that, the others are. The decision needs no GPU: a
DeviceSpec names the device (`device_spec` reads it from a torch.device; tests pass one). On a CPU, or a CUDA GPU
the model has no rates for, or for inputs it does not model (float32 / float64), `auto` is the registry's default
backend with the default workspace.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Optional

from .backends import AUTO, DEFAULT_BACKEND, auto_candidates, get_backend, token_level_route
from .cost_model import DEVICES, DeviceRates, Estimate, Problem, device_key
from .cost_model.device import MIB
from .cost_model.paths import PER_TOKEN_BYTES, chunked_logits_peak_bytes, sequence_store_layout
from .messages import shown
# the workspace where the model does not choose it (CPU, unmodelled devices, a given workspace)
from .backends import DEFAULT_WORKSPACE_BYTES

# What `auto` may allocate beyond the inputs, the outputs, the gradients and the float32 dW accumulator, unless
# the call gives workspace_bytes: the GEMM path's former fixed workspace, so that no call takes more than before.
DEFAULT_MEMORY_BUDGET_BYTES = 1 << 30
MODELLED_DTYPES = ("bfloat16", "float16")
# Memory is a cost too: among the routes within this fraction of the fastest modelled time, the least memory
# (no finer than the model's own resolution; e.g. no-grad log-probs at S1: 297 MiB instead of 890 for 0.5%).
TIME_TOLERANCE = 0.01
# Without a budget from the call, `auto` first looks within the memory the common fused head (16-bit logits tiles,
# cost_model.paths.chunked_logits_peak_bytes) would hold for the same call, and takes the fastest route there
# unless it gives up more than this fraction of the fastest time within DEFAULT_MEMORY_BUDGET_BYTES (a policy: a
# quarter of the head's time for a workspace below the usual fused head's memory).
PREFERRED_MEMORY_TIME_TOLERANCE = 0.25
# How many wave counts around the fewest are tried for balanced waves.
_EXTRA_WAVE_COUNTS = 4


@dataclass(frozen=True)
class DeviceSpec:
    """What routing needs to know of a device: its type and, for CUDA, its name (e.g. 'NVIDIA H100 80GB HBM3')."""
    type: str
    name: str = ""


@dataclass(frozen=True)
class Route:
    backend: str
    workspace_bytes: int  # the workspace of a workspace backend (what it would be, for another backend)
    reason: str
    predicted_s: Optional[float] = None


def device_spec(device: object) -> DeviceSpec:
    """The DeviceSpec of a torch.device (a CUDA device's name is read once per index)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return DeviceSpec(device.type)
    return DeviceSpec("cuda", _cuda_name(device.index if device.index is not None else torch.cuda.current_device()))


@functools.lru_cache(maxsize=16)
def _cuda_name(index: int) -> str:
    import torch

    return torch.cuda.get_device_name(index)


def problem_for(operation: str, tokens: int, hidden: int, vocab: int, dtype: str,
                workspace_bytes: int = DEFAULT_WORKSPACE_BYTES, sequence_rows: int = 0) -> Problem:
    """The model's Problem of one of the four operations ('token', 'sequence', 'frozen', 'logprobs');
    `sequence_rows` the longest sequence's rows of a sequence-level loss separable by sequence (0: not one)."""
    shapes = {"token": dict(operation="loss"), "sequence": dict(operation="loss", level="sequence"),
              "frozen": dict(operation="loss", frozen_head=True), "logprobs": dict(operation="logprobs")}
    if operation not in shapes:
        raise ValueError(f"operation must be one of {sorted(shapes)}, got {operation!r}")
    return Problem(tokens=max(1, tokens), hidden=hidden, vocab=vocab, dtype=dtype, workspace_bytes=workspace_bytes,
                   sequence_rows=sequence_rows if operation == "sequence" else 0, **shapes[operation])


def _budget_rows(p: Problem, budget_bytes: int) -> int:
    """Float32 logits rows of a wave that the budget holds beside the per-token vectors (may be < 1)."""
    return min(p.valid_tokens, (budget_bytes - p.valid_tokens * PER_TOKEN_BYTES) // (4 * p.vocab))


def holds_useful_workspace(p: Problem, rates: DeviceRates, budget_bytes: int) -> bool:
    """Whether the budget holds a workspace backend's minimum useful workspace: waves of one whole GEMM tile of
    rows (all the rows, when fewer). Thinner waves leave the GEMM's tiles part empty and pay a launch per few rows."""
    return _budget_rows(p, budget_bytes) >= min(p.valid_tokens, rates.gemm_tile[0])


def workspace_candidates(p: Problem, rates: DeviceRates, budget_bytes: int) -> list[int]:
    """Workspaces worth modelling: every whole number of GEMM tile rows that the budget holds, and balanced waves
    (the rows split evenly, rounded up to whole tile rows) for the fewest wave counts."""
    row_bytes = 4 * p.vocab
    tile_rows = rates.gemm_tile[0]
    N = p.valid_tokens
    most_rows = max(1, _budget_rows(p, budget_bytes))
    rows = {most_rows, *range(tile_rows, most_rows + 1, tile_rows)}
    fewest = math.ceil(N / most_rows)
    for count in range(fewest, fewest + _EXTRA_WAVE_COUNTS):
        balanced = math.ceil(math.ceil(N / count) / tile_rows) * tile_rows
        rows.add(min(N, balanced))
    candidates = {r * row_bytes for r in rows if r <= most_rows}
    if p.sequence_rows:  # the one-pass sequence route's: a scratch and a store of 1, 2, ... whole sequences
        scratch = sequence_store_layout(N, p.vocab, p.itemsize, 0)[0] * row_bytes
        stores = (k * min(p.sequence_rows, N) * p.vocab * p.itemsize for k in range(1, N // p.sequence_rows + 1))
        candidates |= {scratch + store for store in stores if scratch + store <= budget_bytes}
    return sorted(candidates)


def modelled_route(p: Problem, rates: DeviceRates, budget_bytes: Optional[int] = None,
                   backends: Optional[tuple[str, ...]] = None, two_pass: tuple[str, ...] = ()
                   ) -> tuple[Route, Estimate]:
    """The fastest modelled (backend, workspace) whose peak extra memory fits the budget (of those within
    TIME_TOLERANCE of the fastest, the least memory); when none fits, the one with the least peak extra memory.
    budget_bytes None (the call gave none): DEFAULT_MEMORY_BUDGET_BYTES, and the fastest route within the common
    fused head's memory when it is within PREFERRED_MEMORY_TIME_TOLERANCE of that.
    `backends`: those with a cost model (default: every one `auto` may pick); `two_pass`: those that would run a
    token-level `p` in two steps (charged as the sequence-level loss). A workspace backend is left out when the
    budget is below its minimum useful workspace and another backend can run the call."""
    if budget_bytes is None:
        chosen = _route_within(p, rates, DEFAULT_MEMORY_BUDGET_BYTES, backends, two_pass)
        preferred_bytes = min(DEFAULT_MEMORY_BUDGET_BYTES, chunked_logits_peak_bytes(p))
        smaller = _route_within(p, rates, preferred_bytes, backends, two_pass)
        if smaller[1].peak_extra_bytes <= preferred_bytes and \
                smaller[0].predicted_s <= chosen[0].predicted_s * (1 + PREFERRED_MEMORY_TIME_TOLERANCE):
            return replace(smaller[0], reason=smaller[0].reason + " (the usual fused head's memory)"), smaller[1]
        return chosen
    return _route_within(p, rates, budget_bytes, backends, two_pass)


def _route_within(p: Problem, rates: DeviceRates, budget_bytes: int, backends: Optional[tuple[str, ...]],
                  two_pass: tuple[str, ...]) -> tuple[Route, Estimate]:
    backends = auto_candidates() if backends is None else backends
    streaming = [name for name in backends if not get_backend(name).uses_workspace]
    options: list[tuple[Route, Estimate]] = []
    for backend in backends:
        spec = get_backend(backend)
        problem = replace(p, level="sequence") if backend in two_pass and p.operation == "loss" else p
        if not spec.uses_workspace:
            est = spec.cost_model()(problem)
            options.append((Route(backend, p.workspace_bytes, "", est.seconds(rates)), est))
        elif holds_useful_workspace(p, rates, budget_bytes) or not streaming:
            for workspace in workspace_candidates(p, rates, budget_bytes) or [4 * p.vocab]:
                est = spec.cost_model()(replace(problem, workspace_bytes=workspace))
                options.append((Route(backend, workspace, "", est.seconds(rates)), est))
    fitting = [option for option in options if option[1].peak_extra_bytes <= budget_bytes]
    if fitting:
        fastest = min(option[0].predicted_s for option in fitting)
        close = [option for option in fitting if option[0].predicted_s <= fastest * (1 + TIME_TOLERANCE)]
        route, est = min(close, key=lambda option: (option[1].peak_extra_bytes, option[0].predicted_s))
        why = f"fastest by the cost model on {rates.name} within {budget_bytes / MIB:.3g} MiB"
    else:
        route, est = min(options, key=lambda option: option[1].peak_extra_bytes)
        why = f"nothing fits {budget_bytes / MIB:.3g} MiB by the cost model on {rates.name}: the least memory"
    return replace(route, reason=why), est


def route(operation: str, tokens: int, hidden: int, vocab: int, dtype: str, device: DeviceSpec,
          budget_bytes: Optional[int] = None, backends: Optional[tuple[str, ...]] = None,
          two_pass: tuple[str, ...] = (), sequence_rows: int = 0) -> Route:
    """The path `auto` takes for one call: `operation` one of 'token', 'sequence', 'frozen', 'logprobs';
    `tokens` rows through the head; `dtype` the inputs' ('bfloat16', ...); `budget_bytes` the call's memory
    budget (None: modelled_route's default); `backends` those the call allows (default: every one `auto` may
    pick); `two_pass` those of them that would run a token-level call in two steps; `sequence_rows` the longest
    sequence's rows of a sequence-level loss separable by sequence (0: not one)."""
    if budget_bytes is not None and (not isinstance(budget_bytes, int) or isinstance(budget_bytes, bool)
                                     or budget_bytes <= 0):
        raise ValueError(f"memory budget must be a positive int (bytes), got {shown(budget_bytes)}")
    backends = auto_candidates() if backends is None else tuple(backends)
    modelled = tuple(name for name in backends if get_backend(name).cost is not None)
    key = device_key(device.name) if device.type == "cuda" else None
    if key is None or dtype not in MODELLED_DTYPES or not modelled:
        where = (f"{device.type} device" if device.type != "cuda" else
                 f"{device.name or 'CUDA device'} (no rates in the cost model)" if key is None else
                 f"{dtype} inputs" if dtype not in MODELLED_DTYPES else f"no cost model for {list(backends)}")
        fallback = DEFAULT_BACKEND if DEFAULT_BACKEND in backends or not backends else backends[0]
        return Route(fallback, DEFAULT_WORKSPACE_BYTES, f"not modelled ({where}): {fallback}, default workspace")
    return _cached_route(operation, tokens, hidden, vocab, dtype, key, budget_bytes, modelled, tuple(two_pass),
                         sequence_rows)


@functools.lru_cache(maxsize=256)
def _cached_route(operation: str, tokens: int, hidden: int, vocab: int, dtype: str, key: str,
                  budget_bytes: Optional[int], backends: tuple[str, ...], two_pass: tuple[str, ...],
                  sequence_rows: int = 0) -> Route:
    chosen, _ = modelled_route(problem_for(operation, tokens, hidden, vocab, dtype, sequence_rows=sequence_rows),
                               DEVICES[key], budget_bytes, backends, two_pass)
    return chosen


def operation_of(grads: bool, token_level: bool, weight_grad: bool) -> str:
    """The modelled operation of a call: no gradient at all is 'logprobs'; a objective that needs its tokens'
    statistics first (sequence-level, kept-token sets, a compiled graph) is 'sequence'; else 'frozen' or 'token'."""
    if not grads:
        return "logprobs"
    if not token_level:
        return "sequence"
    return "token" if weight_grad else "frozen"


def resolve(backend: str, workspace_bytes: Optional[int], hidden, head, config=None, kept_sets: bool = False,
            sequence_rows: int = 0) -> tuple[str, int]:
    """(backend, workspace) of one call; `config` the loss's GRPOLossConfig (None: log-probs), `kept_sets` whether
    it scores kept-token sets; `sequence_rows` the longest sequence's rows where the loss may run in waves of whole
    sequences (sequence_route.py; 0: it may not). `auto` routes by the model among the backends that support the call; an explicit
    backend is kept, and a workspace backend's workspace, when not given, is the model's choice without a budget
    from the call (modelled_route). A given `workspace_bytes` is the memory budget of `auto` (and the workspace of an explicit workspace
    backend). Under torch.compile, and for a sharded head (the model has no collectives), `auto` is the default
    backend."""
    import torch

    compiling = torch.compiler.is_compiling()
    sharded = head.shard is not None
    explicit = backend != AUTO and (not get_backend(backend).uses_workspace or workspace_bytes is not None)
    if explicit or compiling:
        # Inside a compiled graph the route is not modelled (Dynamo would have to trace the model's Python).
        return (DEFAULT_BACKEND if backend == AUTO else backend), \
            DEFAULT_WORKSPACE_BYTES if workspace_bytes is None else workspace_bytes
    weight_grad = torch.is_grad_enabled() and head.weight_needs_grad()
    grads = weight_grad or (torch.is_grad_enabled() and hidden.requires_grad)
    allowed = (backend,) if backend != AUTO else (DEFAULT_BACKEND,) if sharded else auto_candidates(
        kept_sets=kept_sets, transformed=not head.transform.is_identity)
    fused = {name: token_level_route(name, config, kept_sets=kept_sets, sharded=sharded) is not None
             for name in allowed}
    operation = operation_of(grads, any(fused.values()), weight_grad)
    chosen = route(operation, hidden.numel() // max(1, hidden.shape[-1]), hidden.shape[-1], head.weight.shape[0],
                   str(hidden.dtype).removeprefix("torch."), device_spec(hidden.device),
                   workspace_bytes, allowed,
                   tuple(name for name, is_fused in fused.items() if not is_fused), sequence_rows)
    return chosen.backend, chosen.workspace_bytes
