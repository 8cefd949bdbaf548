"""The backends, one module each, behind one Protocol (protocol.py), and the registry: the one place a backend's
name is spelled and its behaviour declared. The API, routing, the custom ops, the vocabulary-parallel wrapper,
the engine's config and the roofline read the entries; nothing else names a backend.

    reference.py        materializes the logits, autograd of the eager formula: the baseline
    torch_streaming.py  token chunks x vocabulary chunks in torch ops, online log-sum-exp (any device)
    gemm.py             waves of tokens through one GEMM into a workspace, a row pass, dZ in place (the default)
    triton.py           the fused Triton kernels of grpo_kernels/kernels/ (interpreted on CPU)
    triton_atomic.py    the same, a trained head's backward in one kernel with float32 atomics (opt-in: not
                        bitwise repeatable run to run, so never `auto`'s pick)

Wrappers implementing the same Protocol around any of them: kept_tokens.KeptTokenHead (log-probs over the
sampler's kept sets) and vocab_parallel (a vocabulary shard: local statistics combined over the group).
A new backend is a module with `backend(workspace_bytes)` returning an object with `linear_forward` /
`linear_backward` (protocol.py), and one `BackendSpec` given to `register_backend`.

This module imports no torch (the engine's config reads the names from it while answering --help).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..messages import shown
from .workspace import DEFAULT_WORKSPACE_BYTES

__all__ = ["AUTO", "BACKENDS", "BASELINE_BACKEND", "DEFAULT_BACKEND", "DEFAULT_WORKSPACE_BYTES", "EPILOGUE", "ONE_PASS", "BackendSpec",
           "LogitsBackend", "LogprobBackend", "TokenLevelRoute", "auto_candidates", "backend_names", "check_backend_name",
           "get_backend",
           "implementation", "refuse_unsupported", "register_backend", "stats_dtype", "token_level_route"]

_PROTOCOL_NAMES = ("LogitsBackend", "LogprobBackend", "stats_dtype")


def __getattr__(name: str) -> Any:
    # protocol.py imports torch: loaded on first use, so that reading the registry costs no torch import
    if name in _PROTOCOL_NAMES:
        from . import protocol

        return getattr(protocol, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class TokenLevelRoute:
    """A way a backend evaluates a token-level objective inside its streaming pass (instead of the two-step route:
    statistics, the objective by autograd, gradients from g and e). `method` is the backend object's method that
    runs it (protocol.py: OnePassBackend, EpilogueBackend); the flags say where the route applies."""

    name: str
    method: str
    vocab_shards: bool  # also on a vocabulary shard (the statistics combined over the group per wave)
    torch_compile: bool  # also inside a torch.compile'd graph
    epilogue_only: bool  # only for loss types the kernels' epilogue implements (losses.LossType.epilogue)
    # also under a caller's TorchDispatchMode (FlopCounterMode, ...; dispatch_modes.py): torch.func inside a custom
    # op's implementation does not run there
    dispatch_modes: bool = True


# g and e per wave inside the streaming pass, the gradients in the forward: 3 GEMMs. It differentiates the
# objective with torch.func inside a custom op, which a compiled graph cannot run.
ONE_PASS = TokenLevelRoute("one_pass", "linear_forward_with_grads", vocab_shards=True, torch_compile=False,
                           epilogue_only=False, dispatch_modes=False)
# the objective fused into the forward kernel's epilogue (kernels/token_objective.py), for its loss types
EPILOGUE = TokenLevelRoute("epilogue", "linear_grpo_forward", vocab_shards=False, torch_compile=False,
                           epilogue_only=True)


@dataclass(frozen=True)
class BackendSpec:
    """One backend: where its forward and backward live, its cost model, whether `auto` may pick it, and what it
    supports. Every caller asks the entry, never the name."""

    name: str
    # The module whose `backend(workspace_bytes)` returns the LogprobBackend (its linear_forward and
    # linear_backward, and the route's method): ".name" for a module of this package, or an absolute name.
    module: str
    summary: str
    # "module:function" of its cost model (cost_model.Problem -> cost_model.Estimate); None: not modelled.
    cost: Optional[str] = None
    # `backend="auto"` may pick it (where the cost model says it is fastest within the budget); needs `cost`.
    auto: bool = False
    # It streams through a float32 logits workspace of `workspace_bytes` (auto sizes it within the budget).
    uses_workspace: bool = False
    # How a token-level objective is fused into its streaming pass (ONE_PASS, EPILOGUE); None: never fused.
    token_level_route: Optional[TokenLevelRoute] = None
    # A loss separable by sequence in one pass over waves of whole sequences (backends/gemm.py: stream_sequence_waves:
    # linear_forward_with_sequence_grads, sequence_store_rows), where its store holds the longest sequence.
    sequence_waves: bool = False
    kept_token_sets: bool = True  # kept_token_ids: log-probs over a sampler's kept sets
    vocab_shards: bool = True  # a vocabulary-parallel head (each rank holds rows of W)
    logit_transforms: bool = True  # a LogitTransform (scale, soft-cap) other than the identity
    # A row's log-prob and entropy are bitwise the same whatever else is in the batch (its size, its position).
    batch_invariant: bool = False
    # Same inputs, same bits, run to run (values and gradients). False: refused under
    # torch.use_deterministic_algorithms(True), and never picked by `auto`.
    deterministic: bool = True
    torch_compile: bool = True  # it runs inside a torch.compile'd graph (fullgraph)
    second_order: bool = False  # its gradients are plain autograd: differentiable again (create_graph=True)
    # It builds the [tokens, V] logits (plain autograd through the eager formula).
    materializes_logits: bool = False
    # It runs Triton kernels: on CPU tensors, in the Triton interpreter (tiny shapes only).
    triton_kernels: bool = False
    # The backend computing grpo_loss_from_logits's statistics from given logits (a LogitsBackend module).
    logits_module: str = ".torch_streaming"
    # The hidden / weight dtypes it computes in (names of torch dtypes); others are refused at the boundary
    # (validation.check_backend_dtype), before any work, with the same message for every backend.
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16", "float64")

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or self.name == AUTO:
            raise ValueError(f"BackendSpec.name must be a non-empty string other than {AUTO!r}, got {self.name!r}")
        if self.auto and self.cost is None:
            raise ValueError(f"backend {self.name!r}: auto=True needs a cost model (cost='module:function')")
        if self.auto and not self.deterministic:
            raise ValueError(f"backend {self.name!r}: auto=True needs deterministic=True (auto never trades "
                             "run-to-run repeatability for speed; a caller opts into that by naming the backend)")
        if self.second_order and not self.materializes_logits:
            raise ValueError(f"backend {self.name!r}: second_order=True needs materializes_logits=True (the only "
                             "route whose gradients are plain autograd)")
        if self.materializes_logits and self.vocab_shards:
            raise ValueError(f"backend {self.name!r}: a backend that materializes the logits would gather the whole "
                             "head on a vocabulary shard: declare vocab_shards=False")
        if self.token_level_route is not None and not isinstance(self.token_level_route, TokenLevelRoute):
            raise ValueError(f"backend {self.name!r}: token_level_route must be ONE_PASS, EPILOGUE or None, got "
                             f"{self.token_level_route!r}")

    def backend(self, workspace_bytes: int):
        """The LogprobBackend object (protocol.py); a module from outside this package (a user's plugin) behind
        the Protocol's checks at each call (checked.py)."""
        made = _module(self.module).backend(workspace_bytes)
        if self.module.startswith("."):
            return made
        from .checked import CheckedBackend

        return CheckedBackend(made, self.name)

    def logits_backend(self):
        """The LogitsBackend object (protocol.py)."""
        return _module(self.logits_module).backend(0)

    def cost_model(self) -> Optional[Callable]:
        """Its cost model: Problem -> Estimate (grpo_kernels/cost_model), or None."""
        if self.cost is None:
            return None
        module, _, function = self.cost.partition(":")
        return getattr(_module(module), function)


def _module(name: str):
    return importlib.import_module(name, package=__name__)


AUTO = "auto"
# In the reports' row order: the baseline first.
BACKENDS: dict[str, BackendSpec] = {}


def register_backend(spec: BackendSpec) -> BackendSpec:
    """Add a backend: every `backend=` argument, `auto` (when spec.auto), the engine's config and the roofline
    take it from then on. Its module must provide `backend(workspace_bytes)`."""
    if not isinstance(spec, BackendSpec):
        raise TypeError(f"register_backend takes a BackendSpec, got {type(spec).__name__}")
    if spec.name in BACKENDS:
        raise ValueError(f"backend {spec.name!r} is already registered")
    if not callable(getattr(_module(spec.module), "backend", None)):
        raise ValueError(f"backend {spec.name!r}: module {spec.module!r} has no backend(workspace_bytes) function")
    if spec.cost is not None and not callable(spec.cost_model()):
        raise ValueError(f"backend {spec.name!r}: cost {spec.cost!r} is not a function")
    BACKENDS[spec.name] = spec
    return spec


for _spec in (
    BackendSpec("reference", ".reference", "materialized logits, autograd of the eager formula",
                cost="..cost_model.paths:reference", materializes_logits=True, vocab_shards=False, second_order=True),
    BackendSpec("torch", ".torch_streaming", "token x vocabulary chunks in torch ops, online log-sum-exp",
                cost="..cost_model.paths:torch_chunked"),
    # batch-invariant: the forward's vocabulary splits depend on V only, and no reduction crosses rows
    # (kernels/linear_forward.py); deterministic: each backward output element has one writer
    # (kernels/linear_backward.py)
    BackendSpec("triton", ".triton", "fused Triton streaming kernels (logits never leave the chip)",
                cost="..cost_model.paths:triton", auto=True, token_level_route=EPILOGUE, triton_kernels=True,
                logits_module=".triton", dtypes=("float32", "bfloat16", "float16"), batch_invariant=True),
    # the same forward; a trained head's backward in one kernel with float32 atomics (kernels/tile_backward.py)
    BackendSpec("triton_atomic", ".triton_atomic", "the fused Triton kernels, a trained head's backward in one kernel "
                "(each logits tile recomputed once for dH and dW, float32 atomics: not bitwise repeatable)",
                cost="..cost_model.paths:triton_tiles", token_level_route=EPILOGUE, triton_kernels=True,
                logits_module=".triton", dtypes=("float32", "bfloat16", "float16"), batch_invariant=True,
                deterministic=False),
    # token chunks through the persistent TMA kernel, statistics in its epilogue, dz in place over the chunk of
    # exponentials it stored, dH and dW by GEMM in chunk order; or, where a small workspace makes the chunks cost more, its statistics
    # first and the GEMM path's gradient pass in vocabulary slices (backends/triton_tma.py): deterministic and
    # batch-invariant
    BackendSpec("triton_tma", ".triton_tma", "Hopper recipe: persistent TMA Triton forward over token chunks, "
                "dz in place over the chunk of exponentials it stored, dH and dW by GEMM; in a small workspace, its "
                "statistics "
                "first and the gradients in vocabulary slices",
                cost="..cost_model.triton_tma:triton_tma", uses_workspace=True,
                token_level_route=ONE_PASS, triton_kernels=True, logits_module=".triton",
                dtypes=("float32", "bfloat16", "float16"), batch_invariant=True),
    BackendSpec("gemm", ".gemm", "GEMM-rate waves: cuBLAS GEMMs and Triton row kernels on CUDA, torch ops elsewhere",
                cost="..cost_model.paths:gemm", auto=True, uses_workspace=True, token_level_route=ONE_PASS,
                sequence_waves=True),
):
    BACKENDS[_spec.name] = _spec  # the package's own: their modules are imported on first use, not here

# What 'auto' runs where the cost model does not route (a CPU, an unmodelled GPU or dtype, a sharded head, a
# compiled graph), and on given logits. It supports every feature.
DEFAULT_BACKEND = "gemm"
# The baseline every benchmark ratio is taken against: the backend that materializes the logits.
BASELINE_BACKEND = next(name for name, spec in BACKENDS.items() if spec.materializes_logits)


def backend_names(with_auto: bool = True) -> tuple[str, ...]:
    """The names `backend=` takes: 'auto' and every registered backend (the engine's `run.loss_backend` too)."""
    return ((AUTO,) if with_auto else ()) + tuple(BACKENDS)


def get_backend(name: object, argument: str = "backend") -> BackendSpec:
    """The registry entry of `name`; an unknown name is one error naming `argument` and today's choices."""
    spec = BACKENDS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(f"{argument} must be one of {backend_names()}, got {shown(name)}")
    return spec


def check_backend_name(name: object, argument: str = "backend") -> str:
    """`name` if `backend=` takes it now ('auto' or a registered backend, read from the registry at this call, so
    that a backend registered after import is taken), else one error naming `argument`."""
    if not (isinstance(name, str) and name == AUTO):  # (an array's != would compare elementwise)
        get_backend(name, argument)
    return name


# ---- what a call needs, against what an entry declares -------------------------------------------------------

_FEATURES = {  # the call's need -> (the entry's flag, how the refusal names it)
    "kept_sets": ("kept_token_sets", "kept-token sets (kept_token_ids)"),
    "sharded": ("vocab_shards", "a vocabulary-sharded head"),
    "transformed": ("logit_transforms", "a logit_transform other than the identity"),
    "compiling": ("torch_compile", "running inside a torch.compile'd graph"),
    "deterministic": ("deterministic", "torch.use_deterministic_algorithms(True) (bitwise repeatable results)"),
}


def _supports(spec: BackendSpec, **needs: bool) -> bool:
    return all(getattr(spec, _FEATURES[need][0]) for need, wanted in needs.items() if wanted)


def refuse_unsupported(name: str, *, kept_sets: bool = False, sharded: bool = False, transformed: bool = False,
                       compiling: bool = False, deterministic: bool = False) -> None:
    """One clear error, before any work, when backend `name` does not declare what the call needs."""
    spec = get_backend(name)
    needs = dict(kept_sets=kept_sets, sharded=sharded, transformed=transformed, compiling=compiling,
                 deterministic=deterministic)
    for need, wanted in needs.items():
        flag, what = _FEATURES[need]
        if wanted and not getattr(spec, flag):
            fitting = [other for other in backend_names() if other == AUTO or _supports(get_backend(other), **needs)]
            raise ValueError(f"backend={name!r} does not support {what} ({flag}=False in its registry entry); "
                             f"use one of {fitting}")


def auto_candidates(*, kept_sets: bool = False, sharded: bool = False, transformed: bool = False,
                    compiling: bool = False) -> tuple[str, ...]:
    """The backends `auto` may choose among for a call with these needs."""
    return tuple(name for name, spec in BACKENDS.items()
                 if spec.auto and _supports(spec, kept_sets=kept_sets, sharded=sharded, transformed=transformed,
                                            compiling=compiling))


def token_level_route(name: str, config, *, kept_sets: bool = False, sharded: bool = False,
                      compiling: bool = False, float64: bool = False, dispatch_mode: bool = False
                      ) -> Optional[TokenLevelRoute]:
    """The one decision whether a loss call runs its objective per token inside backend `name`'s streaming pass,
    and how; None: the two-step route. `config` a GRPOLossConfig (None: log-probs, no objective). The objective
    must be a sum of per-token terms (objective.is_token_level); kept-token sets never are fused (their rows never
    touch the whole vocabulary, so there is no logits pass to fuse into); the route must apply to the call (under
    torch.compile, a vocabulary shard, under a caller's TorchDispatchMode)."""
    route = get_backend(name).token_level_route
    # float64 inputs (the oracle) keep float64 throughout: the fused routes evaluate the objective in float32
    if route is None or config is None or kept_sets or float64:
        return None
    from ..losses import get_loss_type
    from ..objective import is_token_level

    if not is_token_level(config) or (compiling and not route.torch_compile) or (sharded and not route.vocab_shards):
        return None
    if route.epilogue_only and get_loss_type(config.loss_type).epilogue is None:
        return None
    # a vocabulary shard runs the route outside the custom op (vocab_parallel.py), where torch.func runs under a mode
    if dispatch_mode and not route.dispatch_modes and not sharded:
        return None
    return route


def implementation(name: str, workspace_bytes: int, kept_token_ids=None):
    """The backend `name` behind the Protocol; with kept_token_ids [rows, K], wrapped so that the rows carrying a
    set are scored over it (kept_tokens.py)."""
    backend = get_backend(name).backend(workspace_bytes)
    if kept_token_ids is None:
        return backend
    from .kept_tokens import KeptTokenHead

    return KeptTokenHead(backend, kept_token_ids, chunk_elements=workspace_bytes // 4)
