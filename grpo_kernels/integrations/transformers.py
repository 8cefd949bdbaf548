"""Patch a transformers causal LM so its forward returns per-token log-probs instead of [B, T, V] logits.

    from grpo_kernels.integrations.transformers import patch_causal_lm
    model = patch_causal_lm(AutoModelForCausalLM.from_pretrained(...))
    out = model(input_ids, attention_mask=attention_mask, labels=labels, return_logprobs=True, return_entropy=True)
    out.logps      # [B, T-1] float32: log p(labels[:, t+1] | tokens <= t), 0 where the label is -100
    out.entropy    # [B, T-1] float32 (None unless return_entropy=True)

The forward runs the backbone, then streams the LM head through `grpo_kernels.linear_logprobs` on the
positions whose label is not -100, with the model's logit transform (Gemma 2/3's final_logit_softcapping,
Cohere's logit_scale, Granite's logits_scaling, ...: lm_head.logit_transform reads every config name TRL 1.16
reads). Without `return_logprobs` / `lm_head_fn` the model's own forward runs unchanged (generation, loss, other
patches). `lm_head_fn=fn` is the general seam the TRL integration uses: `fn(last_hidden_state, weight, bias)`
runs inside the model's forward with the whole LM-head weight, which is what FSDP and ZeRO-3 need, and its
result comes back as `out.head_output`; `head_logit_transform(model)` is the transform fn must apply.

Tested families: Llama, Qwen2 (2.5), Qwen3, Mistral, Gemma (1), Gemma 2 (soft-capped), Cohere and Granite
(scaled).
"""

from __future__ import annotations

import dataclasses
import inspect
import types
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn
from transformers.utils import ModelOutput

from ..api import linear_logprobs_named
from ..argument_names import LOGPROB_NAMES
from ..backends import AUTO, check_backend_name, refuse_unsupported
from ..head import LogitTransform
from ..messages import shown
from ..scalars import require_bool
from .forward_call import (as_keywords, check_batch_inputs, check_head_call, refuse_mistyped_head_keywords,
                           require_head_fn)
from .lm_head import backbone, check_loaded, logit_transform, output_head
from .sharding import call_with_full_head
from .wrappers import causal_lm

IGNORE_INDEX = -100
_SETTINGS_ATTR = "_grpo_kernels_head_settings"
_PATCH_ATTR = "_grpo_kernels_patch"  # the PatchedForward in place
# What the backbone returns when asked (output_hidden_states / output_attentions): the head modes pass it on.
BACKBONE_EXTRAS = ("hidden_states", "attentions")
# Keyword arguments of the plain forward that mean nothing to the backbone when the head is replaced.
_HEAD_ONLY_KWARGS = ("labels", "logits_to_keep", "num_items_in_batch", "shift_labels")

HeadFn = Callable[[torch.Tensor, torch.Tensor, Optional[torch.Tensor]], Any]


# the refusals of the log-probs' checks name the forward's arguments: its labels (shifted), its model's head
LABEL_NAMES = dataclasses.replace(LOGPROB_NAMES, hidden="last_hidden_state", weight="lm_head.weight",
                                  bias="lm_head.bias", targets="labels")


@dataclass(frozen=True)
class HeadSettings:
    backend: str = "auto"
    lm_head_fp32: bool = False  # TRL's cast_lm_head_to_fp32: the head matmul in float32


@dataclass
class CausalLMLogprobsOutput(ModelOutput):
    """`model(..., return_logprobs=True)`: per-token statistics of the shifted labels, no logits."""

    logps: Optional[torch.Tensor] = None
    entropy: Optional[torch.Tensor] = None
    label_mask: Optional[torch.Tensor] = None
    last_hidden_state: Optional[torch.Tensor] = None
    hidden_states: Optional[tuple[torch.Tensor, ...]] = None  # output_hidden_states=True
    attentions: Optional[tuple[torch.Tensor, ...]] = None  # output_attentions=True


@dataclass
class HeadFnOutput(ModelOutput):
    """`model(..., lm_head_fn=fn)`: whatever fn returned, and the hidden states it was given."""

    head_output: Any = None
    last_hidden_state: Optional[torch.Tensor] = None
    hidden_states: Optional[tuple[torch.Tensor, ...]] = None
    attentions: Optional[tuple[torch.Tensor, ...]] = None


def head_compute_dtype(weight: torch.Tensor, hidden: torch.Tensor, lm_head_fp32: bool) -> torch.dtype:
    """The dtype of the LM-head matmul: float32 when asked, else autocast's choice for nn.Linear, else the
    weight's own dtype (what `lm_head(hidden)` would use)."""
    if lm_head_fp32:
        return torch.float32
    if torch.is_autocast_enabled(hidden.device.type):
        return torch.get_autocast_dtype(hidden.device.type)
    return weight.dtype


def head_settings(model: nn.Module) -> HeadSettings:
    """The settings `patch_causal_lm` gave `model` (the defaults for an unpatched one)."""
    return getattr(causal_lm(model), _SETTINGS_ATTR, HeadSettings())


def head_logit_transform(model: nn.Module) -> LogitTransform:
    """The logit transform of a patched model's head (none for an unpatched one), read from its config at each
    call: a value set after patching (final_logit_softcapping changed) was ignored, the log-probs silently off."""
    lm = causal_lm(model)
    return logit_transform(lm) if _patch(lm) is not None else LogitTransform()


def run_head(model: nn.Module, hidden: torch.Tensor, fn: HeadFn) -> Any:
    """fn(hidden, weight, bias) on the whole LM head of `model`, all three in the head's compute dtype."""
    require_head_fn("fn", fn)
    settings = head_settings(model)
    head = output_head(causal_lm(model))
    check_loaded(head)

    def in_compute_dtype(h: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> Any:
        dtype = head_compute_dtype(weight, h, settings.lm_head_fp32)
        h = h.to(weight.device)  # a model split across devices can end its backbone elsewhere
        with torch.autocast(h.device.type, enabled=False):
            return fn(h.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))

    return call_with_full_head(in_compute_dtype, hidden, head)


def shifted_label_logprobs(model: nn.Module, last_hidden_state: torch.Tensor, labels: torch.Tensor,
                           temperature: float, return_entropy: bool, extras: Optional[dict] = None
                           ) -> CausalLMLogprobsOutput:
    """Log-probs (and entropies) of labels[:, 1:] from hidden[:, :-1], only where the label is not -100 (with the
    backbone's `extras`, run_backbone's)."""
    if not isinstance(last_hidden_state, torch.Tensor) or last_hidden_state.dim() != 3:
        # a [T, H] state was sliced along H and failed as an IndexError naming nothing
        raise ValueError(f"last_hidden_state must be a [B, T, H] tensor, got {shown(last_hidden_state)}")
    if not isinstance(labels, torch.Tensor) or labels.shape != last_hidden_state.shape[:-1]:
        raise ValueError(
            f"labels must be a tensor of shape {list(last_hidden_state.shape[:-1])} (same as input_ids), got "
            f"{list(labels.shape) if isinstance(labels, torch.Tensor) else type(labels).__name__}"
        )
    settings, transform = head_settings(model), head_logit_transform(model)
    hidden = last_hidden_state[:, :-1]
    targets = labels[:, 1:].to(hidden.device)
    mask = targets != IGNORE_INDEX

    def valid_positions(h: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]):
        # Prompt and padding positions are skipped: only labelled tokens go through the vocabulary.
        return linear_logprobs_named(LABEL_NAMES, h[mask], weight, targets[mask], bias=bias,
                                     temperature=temperature, return_entropy=True, backend=settings.backend,
                                     logit_transform=transform)

    logps, entropy = run_head(model, hidden, valid_positions)
    # masked_scatter keeps an all-ignored batch connected to the graph (a zero loss still backpropagates).
    scatter = lambda x: x.new_zeros(mask.shape).masked_scatter(mask, x)  # noqa: E731
    return CausalLMLogprobsOutput(logps=scatter(logps), entropy=scatter(entropy) if return_entropy else None,
                                  label_mask=mask, last_hidden_state=last_hidden_state, **(extras or {}))


def run_backbone(model: nn.Module, kwargs: dict) -> tuple[torch.Tensor, dict]:
    """The backbone's last hidden state, called by keyword (forward_call.as_keywords), and what else it returned of
    BACKBONE_EXTRAS: output_hidden_states=True and output_attentions=True were taken and their results dropped."""
    kwargs = {k: v for k, v in kwargs.items() if k not in _HEAD_ONLY_KWARGS}
    kwargs["use_cache"] = False  # scoring, not generating: no KV cache to keep
    if "return_dict" in kwargs or kwargs.get("output_hidden_states") or kwargs.get("output_attentions"):
        kwargs["return_dict"] = True  # a head mode returns its own output class: the extras are read by name
    outputs = backbone(model)(**kwargs)
    if isinstance(outputs, tuple):
        return outputs[0], {}
    return outputs.last_hidden_state, {name: getattr(outputs, name, None) for name in BACKBONE_EXTRAS}


class PatchedForward:
    """`model.forward` once patched: the `return_logprobs=True` and `lm_head_fn=` modes, else the forward it
    replaced (`previous`, None for the class's own).

    A module-level callable holding its model, not a closure: a deep copy of a patched model (TRL's
    create_reference_model, a frozen reference) used to run the *original* model's weights in its plain forward
    and generate(), since the closure kept the original's bound forward; and `torch.save(model)` came back
    unpatched while is_patched() said it was. Copied or pickled, this object comes with its model.
    """

    def __init__(self, model: nn.Module, previous: Optional[Callable[..., Any]]) -> None:
        self.model, self.previous = model, previous

    @property
    def __signature__(self) -> inspect.Signature:
        # The original signature stays visible: `generate` validates its kwargs against it.
        return inspect.signature(types.MethodType(type(self.model).forward, self.model))

    def plain(self, *args: Any, **kwargs: Any) -> Any:
        if self.previous is None:
            return type(self.model).forward(self.model, *args, **kwargs)
        return self.previous(*args, **kwargs)

    def __call__(self, *args: Any, return_logprobs: bool = False, lm_head_fn: Optional[HeadFn] = None,
                 temperature: Optional[float] = None, return_entropy: Optional[bool] = None, **kwargs: Any) -> Any:
        if args and args[0] is self.model:
            # bound as a method of its own model: accelerate's unwrap_model(keep_fp32_wrapper=False) puts back
            # MethodType(model.forward, model), and the model then arrived as input_ids
            args = args[1:]
        refuse_mistyped_head_keywords(self.model, kwargs)
        require_bool("return_logprobs", return_logprobs)
        if return_entropy is not None:
            require_bool("return_entropy", return_entropy)
        if not return_logprobs and (temperature is not None or return_entropy is not None):
            # with lm_head_fn too: fn gets the raw head, and these were silently ignored
            name = "temperature" if temperature is not None else "return_entropy"
            raise ValueError(f"{name} only applies with return_logprobs=True (lm_head_fn gets the raw head)")
        if not return_logprobs and lm_head_fn is None:
            return self.plain(*args, **kwargs)
        if return_logprobs and lm_head_fn is not None:
            raise ValueError("pass either return_logprobs=True or lm_head_fn, not both")
        model = self.model
        kwargs = as_keywords(model, args, kwargs)
        check_head_call(kwargs, return_logprobs, lm_head_fn)
        logit_transform(model)  # the config as it is now (a value set since patching is refused before any work)
        check_loaded(output_head(model))  # the head as it is now (replaced or loaded since patching)
        check_batch_inputs(model, kwargs)  # after the head: a model never loaded is named as such, not its inputs
        last_hidden_state, extras = run_backbone(model, kwargs)
        if lm_head_fn is not None:
            return HeadFnOutput(head_output=run_head(model, last_hidden_state, lm_head_fn),
                                last_hidden_state=last_hidden_state, **extras)
        return shifted_label_logprobs(model, last_hidden_state, kwargs["labels"],
                                      1.0 if temperature is None else temperature, bool(return_entropy), extras)


def _patch(model: nn.Module) -> Optional[PatchedForward]:
    """The patch of `model` itself (not of a model it was copied from), or None."""
    patch = getattr(model, "__dict__", {}).get(_PATCH_ATTR)  # anything may be asked: is_patched(None) is False
    return patch if isinstance(patch, PatchedForward) and patch.model is model else None


def check_backend_serves(model: nn.Module, backend: str) -> None:
    """An explicit backend that cannot run this model's head (a logit transform its registry entry does not take) is
    refused when patching, as the API refuses it before any work; it was refused at the first call, after the
    backbone had run (under TRL, after the first generation). Read at each call too: the config may change."""
    transform = logit_transform(model)
    if backend != AUTO:
        refuse_unsupported(backend, transformed=not transform.is_identity)


def patch_causal_lm(model: nn.Module, *, backend: str = "auto", lm_head_fp32: bool = False) -> nn.Module:
    """Give `model.forward` the `return_logprobs=True` and `lm_head_fn=` modes (in place; returns `model`).

    Patch the *ForCausalLM model itself, before or after wrapping with PEFT / FSDP / DeepSpeed: those wrappers
    call it, so the head runs inside the wrapped forward. A wrapper given here (PeftModel, DataParallel, DDP,
    FSDP1, torch.compile's module) has the model inside it patched (wrappers.causal_lm). Patching twice only
    updates the settings.
    """
    check_backend_name(backend)  # the registry as it is now: a backend registered after import is taken
    require_bool("lm_head_fp32", lm_head_fp32)
    lm = causal_lm(model)
    check_backend_serves(lm, backend)
    backbone(lm)
    output_head(lm)
    setattr(lm, _SETTINGS_ATTR, HeadSettings(backend=backend, lm_head_fp32=lm_head_fp32))
    if _patch(lm) is not None:
        return model
    previous = vars(lm).get("forward")  # None: the class's own forward
    if isinstance(previous, PatchedForward):  # the patch of the model this one was shallow-copied from
        previous = previous.previous
    patch = PatchedForward(lm, previous)
    lm.forward = patch
    setattr(lm, _PATCH_ATTR, patch)
    return model


def is_patched(model: nn.Module) -> bool:
    return _patch(causal_lm(model)) is not None


def unpatch_causal_lm(model: nn.Module) -> nn.Module:
    """Restore the forward `patch_causal_lm` replaced."""
    lm = causal_lm(model)
    patch = _patch(lm)
    if patch is None:
        raise ValueError(f"{type(lm).__name__} is not patched by grpo_kernels")
    current = vars(lm).get("forward")
    if isinstance(current, types.MethodType) and current.__func__ is patch and current.__self__ is lm:
        current = patch  # the patch bound to its model (accelerate's unwrap_model): still the patch alone
    if current is not None and current is not patch:
        # wrapped since patching (accelerate's mixed-precision forward, another library's patch): restoring the
        # forward the patch replaced silently dropped that wrapper, and its autocast or outputs with it
        wrapper = getattr(current, "__qualname__", type(current).__name__)
        raise ValueError(f"{type(lm).__name__}.forward was replaced after patch_causal_lm (by {wrapper:.60}), and "
                         "unpatching would drop that: remove it first (accelerate: "
                         "unwrap_model(model, keep_fp32_wrapper=False))")
    if patch.previous is None:
        vars(lm).pop("forward", None)  # the class's own forward was in place: drop the instance attribute
    else:
        lm.forward = patch.previous  # another patch (e.g. TRL's fused head) was in place: put it back
    delattr(lm, _PATCH_ATTR)
    delattr(lm, _SETTINGS_ATTR)
    return model
