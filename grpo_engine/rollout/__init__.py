"""Rollout backends behind one interface (base.RolloutBackend), chosen by `rollout.backend` from the registry
(registry.py: `hf` samples with Hugging Face `generate` on the policy itself; `vllm` runs a vLLM engine colocated in
the training process; `vllm_server` asks vLLM servers over HTTP; `register_rollout_backend` adds one). A backend's
module is imported only when it is chosen (vLLM is an optional extra), and this package imports no torch until one
of its tensors' modules is asked for: the configuration reads the registry while answering --help.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

from .registry import (
    ROLLOUT_BACKENDS,
    RolloutContext,
    RolloutSpec,
    register_rollout_backend,
    rollout_backend,
    rollout_backend_names,
    unregister_rollout_backend,
)

BACKENDS = ROLLOUT_BACKENDS  # the registry itself: a backend registered later is in it

# Loaded on first use (they import torch and transformers).
_LAZY = {"RolloutBackend": ".base", "RolloutBatch": ".base", "encode_prompts": ".base", "eos_ids": ".base",
         "finish_batch": ".base", "mask_after_eos": ".base", "HFRollout": ".hf", "generate_completions": ".hf"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_backend(config: Any, device: Any, num_processes: int = 1, process_index: int = 0) -> None:
    """What the configured backend cannot do on `device` over `num_processes` with this install, said before
    anything loads."""
    rollout_backend(config.rollout.backend).check(config, device, num_processes, process_index)


def create_backend(config: Any, generation_model: Any, lm: Any, tokenizer: Any, device: Any, model_dir: str,
                   world: Optional[object] = None, run_dir: str = ".", start_version: int = 0) -> Any:
    """The configured backend (registry.RolloutContext says what each argument is)."""
    context = RolloutContext(config, generation_model, lm, tokenizer, device, model_dir, world, run_dir, start_version)
    return rollout_backend(config.rollout.backend).create(context)


__all__ = ["BACKENDS", "HFRollout", "ROLLOUT_BACKENDS", "RolloutBackend", "RolloutBatch", "RolloutContext",
           "RolloutSpec", "check_backend", "create_backend", "encode_prompts", "eos_ids", "finish_batch",
           "generate_completions", "mask_after_eos", "register_rollout_backend", "rollout_backend",
           "rollout_backend_names", "unregister_rollout_backend"]
