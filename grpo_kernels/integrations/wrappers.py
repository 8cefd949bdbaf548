"""The causal LM inside the wrappers training code puts around it, so that `patch_causal_lm` may be handed either.

PEFT's PeftModel (`get_base_model()`), torch.compile's OptimizedModule (`_orig_mod`) and the data-parallel
wrappers that keep the model as `.module` (DataParallel, DistributedDataParallel, FSDP1, DeepSpeed's engine) all
call the inner model's forward with the caller's keyword arguments, so patching the inner model is what patching
the wrapper means. Patching the wrapper itself went wrong: under PEFT the backbone found was the adapter model and
the forward failed inside transformers (an AttributeError naming an output class); a compiled model's compiled
forward was bypassed; DataParallel was refused for having no `.config`.
"""

from __future__ import annotations

from typing import Optional

from torch import nn


def _inner(model: nn.Module) -> Optional[nn.Module]:
    """The model one wrapper in, or None when `model` is no wrapper this module knows."""
    if callable(getattr(model, "get_base_model", None)):  # PEFT
        return model.get_base_model()
    compiled = getattr(model, "_orig_mod", None)  # torch.compile(model)
    if isinstance(compiled, nn.Module):
        return compiled
    # A transformers model has a config; the data-parallel wrappers do not, and keep the model as `.module`.
    wrapped = getattr(model, "module", None)
    if getattr(model, "config", None) is None and isinstance(wrapped, nn.Module):
        return wrapped
    return None


def causal_lm(model: nn.Module) -> nn.Module:
    """The innermost model of `model`'s wrappers (`model` itself when it wraps nothing)."""
    seen = {id(model)}
    inner = _inner(model)
    while inner is not None and id(inner) not in seen:  # a wrapper that names itself must not loop
        model = inner
        seen.add(id(model))
        inner = _inner(model)
    return model
