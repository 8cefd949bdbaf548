"""Finding a causal LM's backbone, LM head and logit transform, and refusing heads the fused kernels cannot
reproduce.

The fused kernels compute softmax(transform(h W^T + b) / temperature), `transform` a scale and a tanh soft-cap
(grpo_kernels.LogitTransform). `logit_transform` reads it from the model's config under every attribute name, in
the order and with the meaning TRL 1.16's fused head gives them (trl.trainer.utils.add_fused_lm_head), so the
kernels' log-probs are TRL's. A config value that is not a usable number, or a PEFT adapter on the head, would
give silently wrong log-probs: those are refused, naming the attribute.
"""

from __future__ import annotations

import math
import numbers
from typing import Optional

import torch
from torch import nn

from ..head import LogitTransform
from ..validation import require_data
from .head_hooks import refuse_bypassed_hooks

# Config attributes that multiply the LM head's output, in the order TRL 1.16 reads them: the first one set wins.
SCALE_ATTRIBUTES = ("logit_scale",  # Cohere, Cohere 2
                    "output_multiplier",  # Muse Glimmer / Spark (before their soft-cap)
                    "lm_head_multiplier")  # Falcon-H1
# Read only when none of those is set: Granite, Granite-MoE and MiniCPM3 divide the logits by it (MiniCPM3 divides
# the hidden states, the same for its bias-free head); HyperCLOVA X multiplies by it.
DIVISOR_ATTRIBUTE = "logits_scaling"
MULTIPLYING_DIVISOR_MODEL_TYPES = ("hyperclovax",)
SOFTCAP_ATTRIBUTE = "final_logit_softcapping"  # Gemma 2/3, Gemma 3n/4, VaultGemma, Mistral Large 4, ...


def text_config(model: nn.Module):
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"model must be a transformers PreTrainedModel with a .config, got {type(model).__name__}")
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _config_number(model: nn.Module, config, name: str) -> Optional[float]:
    """config.<name> as a finite float, None when unset; anything else is refused, naming the attribute."""
    value = getattr(config, name, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ValueError(f"{type(model).__name__} sets config.{name}={value!r}, which grpo_kernels cannot apply to "
                         "its logits: expected a finite number (or None)")
    return float(value)


def logit_transform(model: nn.Module) -> LogitTransform:
    """What `model` does to its LM head's output before the softmax, from its (text) config, as TRL 1.16 reads it:
    a scale (the first of SCALE_ATTRIBUTES set, else 1 / logits_scaling, or logits_scaling itself for HyperCLOVA
    X), then a tanh soft-cap at final_logit_softcapping."""
    config = text_config(model)
    softcap = _config_number(model, config, SOFTCAP_ATTRIBUTE)
    if softcap is not None and softcap <= 0:
        raise ValueError(f"{type(model).__name__} sets config.{SOFTCAP_ATTRIBUTE}={softcap!r}: a soft-cap must be "
                         "> 0 (None for none)")
    scale = None
    for name in SCALE_ATTRIBUTES:
        scale = _config_number(model, config, name)
        if scale is not None:
            break
    if scale is None:
        divisor = _config_number(model, config, DIVISOR_ATTRIBUTE)
        if divisor is not None and getattr(config, "model_type", None) in MULTIPLYING_DIVISOR_MODEL_TYPES:
            scale = divisor
        elif divisor is not None:
            if divisor == 0:
                raise ValueError(f"{type(model).__name__} sets config.{DIVISOR_ATTRIBUTE}=0: its logits would be "
                                 "divided by zero")
            scale = 1.0 / divisor
    return LogitTransform(scale=1.0 if scale is None else scale, softcap=softcap)


def backbone(model: nn.Module) -> nn.Module:
    """The decoder stack that returns `last_hidden_state` (e.g. `LlamaForCausalLM.model`)."""
    module = getattr(model, "base_model", None)
    if module is None or module is model:
        raise TypeError(
            f"{type(model).__name__} has no separate backbone (base_model); expected a *ForCausalLM model"
        )
    return module


def _unwrap_peft_head(head: nn.Module) -> nn.Module:
    # PEFT's `modules_to_save=["lm_head"]` wraps the head; the trainable copy of the active adapter is the head.
    if hasattr(head, "modules_to_save") and hasattr(head, "original_module"):
        active = [] if getattr(head, "disable_adapters", False) else list(getattr(head, "active_adapters", []))
        if active and active[0] in head.modules_to_save:
            return head.modules_to_save[active[0]]
        return head.original_module
    # A LoRA (or other tuner) layer on the head adds a low-rank term that `weight` does not contain.
    if hasattr(head, "base_layer") and hasattr(head, "active_adapters"):
        raise NotImplementedError(
            "lm_head carries a PEFT adapter (lm_head is in target_modules): its output is not lm_head.weight @ h. "
            "Remove lm_head from the adapter's target_modules (or use modules_to_save=['lm_head'])."
        )
    return head


def check_linear_head(head: nn.Module) -> None:
    """The kernels compute `h @ lm_head.weight.T + lm_head.bias`: refuse a head whose own output is something else
    (a subclass of nn.Linear with its own forward, a quantized layer, any other module), which would give
    log-probs of logits the model never computes, without an error."""
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"the LM head {type(head).__name__} has no weight tensor")
    # A tied head exposed as the embedding: the model multiplies by its weight, whatever the embedding's forward.
    plain = isinstance(head, nn.Embedding) or (isinstance(head, nn.Linear)
                                                and type(head).forward is nn.Linear.forward)
    if not plain:
        raise TypeError(f"the LM head is a {type(head).__name__}, expected an nn.Linear (or a subclass keeping its "
                        "forward): grpo_kernels computes lm_head.weight @ h + lm_head.bias, which need not be "
                        "this head's output")
    refuse_bypassed_hooks(head)
    if not weight.is_floating_point():
        raise TypeError(f"lm_head.weight has dtype {str(weight.dtype).removeprefix('torch.')}, expected a floating "
                        "dtype: a quantized head's logits are not lm_head.weight @ h (dequantize it first)")


def check_loaded(head: nn.Module) -> None:
    """At call time: a head on the meta device (a model built empty, its weights never loaded) failed before the
    kernels' own checks, as "Tensor.item() cannot be called on meta tensors"."""
    require_data("lm_head.weight", head.weight)


def output_head(model: nn.Module) -> nn.Module:
    """The LM head module whose `weight` [V, H] (and `bias`) produce the logits."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        raise TypeError(f"{type(model).__name__} has no output embeddings (get_output_embeddings() is None)")
    head = _unwrap_peft_head(head)
    check_linear_head(head)
    return head


def expected_head_shape(head: nn.Module) -> Optional[tuple[int, int]]:
    """[V, H] from the module's own attributes, which sharding engines leave untouched (None if unknown)."""
    if isinstance(head, nn.Linear):
        return head.out_features, head.in_features
    if isinstance(head, nn.Embedding):  # a tied head exposed as the embedding
        return head.num_embeddings, head.embedding_dim
    return None


def check_full_weight(head: nn.Module, weight: torch.Tensor, bias: Optional[torch.Tensor], hidden_size: int) -> None:
    """Never compute with a shard: the weight must be the whole [V, H] matrix (and the bias the whole [V])."""
    expected = expected_head_shape(head)
    shape = tuple(weight.shape)
    problem = None
    if weight.dim() == 2 and shape[1] != hidden_size and shape == expected:
        # the module itself says so: not a shard, a head that does not fit the backbone (replaced by hand)
        raise ValueError(f"lm_head takes {shape[1]} input features, but the model's last_hidden_state has "
                         f"{hidden_size}: the head does not fit the model")
    if weight.dim() != 2 or shape[1] != hidden_size:
        problem = f"lm_head.weight has shape {list(shape)}, expected [V, {hidden_size}]"
    elif expected is not None and shape != expected:
        problem = f"lm_head.weight has shape {list(shape)}, but the module is {list(expected)}"
    elif bias is not None and tuple(bias.shape) != (shape[0],):
        problem = f"lm_head.bias has shape {list(bias.shape)}, expected [{shape[0]}]"
    if problem is not None:
        raise RuntimeError(
            f"{problem}: it looks sharded (ZeRO-3 / FSDP). grpo_kernels gathers it under DeepSpeed ZeRO-3 and for "
            "FSDP2 DTensors; with FSDP1 call the head through the wrapped model's forward (the patched forward does) "
            "and do not wrap lm_head in its own FSDP unit."
        )
