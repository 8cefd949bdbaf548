"""model.lora.target_modules against the model's modules, as peft matches them, before any weight loads.

peft refused a name that matches no module, or one that matches a layer it cannot adapt (a norm), only once the
weights had loaded and the run directory was written, in words that named no setting ("Target modules {'q_projx'}
not found in the base model"; "Target module Qwen2RMSNorm(...) is not supported"). And it took the LM head without
a word, although the engine's fused loss reads the head as a weight (grpo_engine.model.loading.with_lm_head): its
adapters never entered the loss, so they never trained.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch
from torch import nn

from ..config.schema import ALL_LINEAR

SETTING = "model.lora.target_modules"


def adaptable(module: nn.Module) -> bool:
    """A layer kind peft's LoRA adapts (linear, embedding, convolution, multi-head attention)."""
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention,
                               Conv1D))


def matches_target(name: str, target: str) -> bool:
    # peft's rule for a list of names: the module's whole name, or its last dotted parts
    return name == target or name.endswith("." + target)


def lora_targets_problem(lm: nn.Module, targets: Union[str, Sequence[str]]) -> Optional[str]:
    """What keeps peft from training an adapter on each module `targets` names in the causal LM `lm` (its
    structure only: a model on the meta device will do), in one line naming the setting, or None."""
    if targets == ALL_LINEAR:  # peft picks the linear layers itself, the output layer left out
        return None
    modules = dict(lm.named_modules())
    head = lm.get_output_embeddings()
    names = sorted({name.rsplit(".", 1)[-1] for name, module in modules.items()
                    if name and adaptable(module) and module is not head})
    for target in targets:
        matched = [name for name in modules if matches_target(name, target)]
        if not matched:
            return (f"{SETTING}: {target!r} names no module of the model; its adaptable layers are "
                    f"{', '.join(names[:12])}{', ...' if len(names) > 12 else ''} (or all-linear)")
        other = next((name for name in matched if not adaptable(modules[name])), None)
        if other is not None:
            return (f"{SETTING}: {target!r} names {other!r}, a {type(modules[other]).__name__}, which LoRA cannot "
                    f"adapt (linear, embedding and convolution layers only)")
        if head is not None and any(modules[name] is head for name in matched):
            return (f"{SETTING}: {target!r} names the LM head, which the engine's fused loss reads as a weight: "
                    f"adapters on it would never train; leave it out")
    return None


def model_skeleton(model_config: Any) -> Optional[nn.Module]:
    """The causal LM `model_config` describes, its weights on the meta device (no memory, no load); None when
    transformers cannot build it so (its load then says why)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # what building it logs (BERT's "add is_decoder=True"), the load says once
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(model_config)
    except Exception:  # of any type: this is an early look, and the load itself reports what is wrong
        return None
    finally:
        hf_logging.set_verbosity(verbosity)
