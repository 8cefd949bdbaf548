"""Finding a causal LM's backbone and LM head, and refusing heads the fused kernels cannot reproduce.

The fused kernels compute softmax((h W^T + b) / temperature). A model whose logits are anything else (logit
soft-capping, a logit multiplier, a PEFT adapter on the head) would silently get wrong log-probs, so those are
refused here with the attribute that causes it.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

# Config attributes that change the logits after the LM-head matmul. The values that mean "no change".
_LOGIT_TRANSFORMS = {
    "final_logit_softcapping": (None,),  # Gemma 2/3: tanh soft-cap
    "logit_scale": (None, 1.0),  # Cohere
    "logits_scaling": (None, 1.0),  # Granite, MiniCPM
    "output_multiplier": (None, 1.0),
    "lm_head_multiplier": (None, 1.0),  # Falcon-H1
}


def text_config(model: nn.Module):
    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"model must be a transformers PreTrainedModel with a .config, got {type(model).__name__}")
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def check_plain_logits(model: nn.Module) -> None:
    """Raise if the model post-processes its LM-head output in a way the fused kernels do not."""
    config = text_config(model)
    for name, neutral in _LOGIT_TRANSFORMS.items():
        value = getattr(config, name, None)
        if value not in neutral:
            raise NotImplementedError(
                f"{type(model).__name__} sets config.{name}={value!r}: its logits are not "
                "(hidden @ lm_head.weight.T + bias), which is all grpo_kernels computes. Supported: models whose "
                "logits are the plain LM-head output (Llama, Qwen2/2.5/3, Mistral, Gemma 1)."
            )


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


def output_head(model: nn.Module) -> nn.Module:
    """The LM head module whose `weight` [V, H] (and `bias`) produce the logits."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        raise TypeError(f"{type(model).__name__} has no output embeddings (get_output_embeddings() is None)")
    head = _unwrap_peft_head(head)
    if not isinstance(getattr(head, "weight", None), torch.Tensor):
        raise TypeError(f"the LM head {type(head).__name__} has no weight tensor")
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
