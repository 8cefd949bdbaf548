"""The backends, one module each, behind one Protocol (protocol.py), and the registry everything else reads.

    reference.py        materializes the logits, autograd of the eager formula: the baseline
    torch_streaming.py  token chunks x vocabulary chunks in torch ops, online log-sum-exp (any device)
    gemm.py             waves of tokens through one GEMM into a workspace, a row pass, dZ in place (the default)
    triton.py           the fused Triton kernels of grpo_kernels/kernels/ (interpreted on CPU)

Wrappers implementing the same Protocol around any of them: kept_tokens.KeptTokenHead (log-probs over the
sampler's kept sets) and vocab_parallel (a vocabulary shard: local statistics combined over the group).
A new backend is a module with `linear_forward` / `linear_backward` (protocol.py) and one `BackendSpec` below.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional

from .protocol import LogitsBackend, LogprobBackend, stats_dtype

__all__ = ["BACKENDS", "BackendSpec", "LogitsBackend", "LogprobBackend", "backend_names", "get_backend",
           "implementation", "stats_dtype"]

ONE_PASS = "one_pass"  # g and e per wave inside the streaming pass (gradients in the forward: 3 GEMMs)
EPILOGUE = "epilogue"  # the objective fused into the forward kernel's epilogue (loss types with an Epilogue id)


@dataclass(frozen=True)
class BackendSpec:
    """What the API, the benchmarks and the roofline need to know of a backend, beyond the Protocol."""

    name: str
    # The module whose `backend(workspace_bytes)` returns the LogprobBackend: ".name" for a module of this package,
    # or any importable module's absolute name.
    module: str
    summary: str
    # How a token-level objective is fused into the streaming pass (ONE_PASS, EPILOGUE), None: never fused.
    token_level_route: Optional[str] = None
    # It builds the [tokens, V] logits (refused for a sharded head: that would gather the whole head).
    materializes_logits: bool = False
    # It runs Triton kernels: on CPU tensors, in the Triton interpreter (tiny shapes only).
    triton_kernels: bool = False
    # The backend computing grpo_loss_from_logits's statistics from given logits (a LogitsBackend module).
    logits_module: str = ".torch_streaming"
    # The hidden / weight dtypes it computes in (names of torch dtypes); others are refused at the boundary
    # (validation.check_backend_dtype), before any work, with the same message for every backend.
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16", "float64")

    def backend(self, workspace_bytes: int) -> LogprobBackend:
        return _module(self.module).backend(workspace_bytes)

    def logits_backend(self) -> LogitsBackend:
        return _module(self.logits_module).backend(0)


def _module(name: str):
    return importlib.import_module(name, package=__name__)


# In the reports' row order: the baseline first.
BACKENDS: dict[str, BackendSpec] = {spec.name: spec for spec in (
    BackendSpec("reference", ".reference", "materialized logits, autograd of the eager formula",
                materializes_logits=True),
    BackendSpec("torch", ".torch_streaming", "token x vocabulary chunks in torch ops, online log-sum-exp"),
    BackendSpec("triton", ".triton", "fused Triton streaming kernels (logits never leave the chip)",
                token_level_route=EPILOGUE, triton_kernels=True, logits_module=".triton",
                dtypes=("float32", "bfloat16", "float16")),
    BackendSpec("gemm", ".gemm", "GEMM-rate waves: cuBLAS GEMMs and Triton row kernels on CUDA, torch ops elsewhere",
                token_level_route=ONE_PASS),
)}
AUTO = "auto"
DEFAULT_BACKEND = "gemm"  # what 'auto' runs where the cost model does not route (routing.py), and on given logits
# The baseline every benchmark ratio is taken against: the backend that materializes the logits.
BASELINE_BACKEND = next(name for name, spec in BACKENDS.items() if spec.materializes_logits)


def backend_names(with_auto: bool = True) -> tuple[str, ...]:
    """The names `backend=` takes: 'auto' and every registered backend."""
    return ((AUTO,) if with_auto else ()) + tuple(BACKENDS)


def get_backend(name: object) -> BackendSpec:
    spec = BACKENDS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(f"backend must be one of {backend_names()}, got {name!r}")
    return spec


def implementation(name: str, workspace_bytes: int, kept_token_ids=None) -> LogprobBackend:
    """The backend `name` behind the Protocol; with kept_token_ids [rows, K], wrapped so that the rows carrying a
    set are scored over it (kept_tokens.py)."""
    backend = get_backend(name).backend(workspace_bytes)
    if kept_token_ids is None:
        return backend
    from .kept_tokens import KeptTokenHead

    return KeptTokenHead(backend, kept_token_ids, chunk_elements=workspace_bytes // 4)
