"""grpo_kernels: a fused GRPO loss that never materializes the [tokens, vocab] logits.

    from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss
    out = fused_linear_grpo_loss(hidden, lm_head.weight, completion_ids, completion_mask, advantages,
                                 config=GRPOLossConfig(loss_type="dapo", beta=0.04), ref_logps=ref_logps)
    out.loss.backward()
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Public names and the submodule each lives in. They are imported on first use, so that reading only the
# config (GRPOLossConfig: plain Python) costs no torch import, which takes seconds: `grpo-engine --help`
# builds its flags from it.
_EXPORTS = {
    "GRPOLossConfig": "config",
    "GRPOLossOutput": "objective",
    "FusedLinearGRPOLoss": "module",
    "fused_linear_grpo_loss": "api",
    "grpo_loss_from_logits": "api",
    "grpo_objective": "objective_entry",
    "LMHead": "head",
    "LogitTransform": "head",
    "linear_logprobs": "api",
    "reference": "reference",  # the submodule itself
    "register_loss_type": "losses",
    "unregister_loss_type": "losses",
    "LossParam": "losses",
    "TermInputs": "losses",
    "BackendSpec": "backends",
    "register_backend": "backends",
    "backend_names": "backends",
}
_TORCH_FREE = {"config", "losses", "backends"}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"

if TYPE_CHECKING:
    from . import reference
    from .api import fused_linear_grpo_loss, grpo_loss_from_logits, linear_logprobs
    from .backends import BackendSpec, backend_names, register_backend
    from .config import GRPOLossConfig
    from .losses import LossParam, TermInputs, register_loss_type, unregister_loss_type
    from .module import FusedLinearGRPOLoss
    from .objective import GRPOLossOutput
    from .objective_entry import grpo_objective


def __getattr__(name: str) -> Any:
    submodule = _EXPORTS.get(name)
    if submodule is None:
        raise AttributeError(f"module 'grpo_kernels' has no attribute {name!r}")
    if submodule not in _TORCH_FREE:
        # Triton can run on a machine without CUDA only interpreted, and the interpreter must be chosen before
        # triton is imported (by anyone): the first use of a torch-backed name chooses it.
        from .kernels.launch import use_interpreter_if_no_gpu

        use_interpreter_if_no_gpu()
    module = importlib.import_module(f".{submodule}", __name__)
    value = module if name == submodule else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
