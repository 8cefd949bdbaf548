"""One-line switches to the fused kernels for existing training code.

* `grpo_kernels.integrations.transformers.patch_causal_lm(model)`: a transformers causal LM whose forward
  returns per-token log-probs / entropies (`return_logprobs=True`) instead of logits.
* `grpo_kernels.integrations.trl.GRPOKernelsTrainer` / `patch_grpo_trainer(trainer)`: TRL's GRPOTrainer with
  its log-probs, loss and metrics from the fused kernels (needs TRL, imported only from that module).
* `grpo_kernels.integrations.trust_head_hooks("pkg")`: keep the LM-head hooks of a framework that only gathers,
  moves or casts the head's weight (those of DeepSpeed, FSDP2, accelerate, transformers and TRL are kept already).

The transformers names below are imported on first use: the torch-only modules beside them (lm_head, sharding)
import without transformers installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .head_hooks import trust_head_hooks

_TRANSFORMERS_EXPORTS = ("CausalLMLogprobsOutput", "is_patched", "patch_causal_lm", "unpatch_causal_lm")

__all__ = [*_TRANSFORMERS_EXPORTS, "trust_head_hooks"]

if TYPE_CHECKING:
    from .transformers import CausalLMLogprobsOutput, is_patched, patch_causal_lm, unpatch_causal_lm


def __getattr__(name: str) -> Any:
    if name not in _TRANSFORMERS_EXPORTS:
        raise AttributeError(f"module 'grpo_kernels.integrations' has no attribute {name!r}")
    value = getattr(importlib.import_module(".transformers", __name__), name)
    globals()[name] = value
    return value
