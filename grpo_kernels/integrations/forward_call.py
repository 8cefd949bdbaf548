"""The arguments of a patched forward in its head modes (`return_logprobs=True`, `lm_head_fn=`), checked before the
backbone runs.

Found by probing (each failed only after the whole backbone had run, or never): labels given positionally were
reported missing; positional arguments past the fifth reached the backbone, whose forward orders them differently
(a CausalLM's sixth is `labels`, its backbone's `use_cache`); unbatched [T] input_ids and labels failed inside
attention; a non-callable `lm_head_fn` failed as "'str' object is not callable"; `logits_to_keep` was silently
ignored, every position being scored.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import torch
from torch import nn

from ..messages import shown

# Keyword arguments that shape the model's own logits; the head modes score the positions the labels select.
LOGIT_SELECTING_KWARGS = ("logits_to_keep", "num_logits_to_keep")
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def as_keywords(model: nn.Module, args: tuple, kwargs: dict) -> dict:
    """`args` under the names the model's own forward gives them, merged into `kwargs`: the backbone is called by
    keyword, whatever order its forward has."""
    if not args:
        return dict(kwargs)
    parameters = [p for p in list(inspect.signature(type(model).forward).parameters.values())[1:]  # after self
                  if p.kind in _POSITIONAL]
    forward = f"{type(model).__name__}.forward"
    if len(args) > len(parameters):
        raise TypeError(f"{forward} takes at most {len(parameters)} positional arguments "
                        f"({', '.join(p.name for p in parameters)}), got {len(args)}")
    for parameter in parameters[:len(args)]:
        if parameter.name in kwargs:
            raise TypeError(f"{forward} got {parameter.name} both positionally and by keyword")
    # a default given positionally (None to reach a later argument) is left out, as if not given: transformers
    # warns of renamed arguments (past_key_values) only when they are passed
    given = {p.name: value for p, value in zip(parameters, args) if value is not p.default}
    return {**given, **kwargs}


def require_head_fn(name: str, fn: Any) -> None:
    """fn: a callable taking (last_hidden_state, weight, bias) positionally; one taking other arguments failed
    only once the backbone had run."""
    if not callable(fn):
        raise TypeError(f"{name} must be a callable fn(last_hidden_state, weight, bias), got {shown(fn)}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: called as it is
        return
    try:
        signature.bind(None, None, None)
    except TypeError as error:
        raise TypeError(f"{name} must take (last_hidden_state, weight, bias) positionally: {error}") from None


def _batch_shape(kwargs: dict) -> tuple[str, Optional[tuple[int, ...]]]:
    """(the inputs' name, [B, T]): input_ids' shape, or inputs_embeds' without its last dim (None when neither)."""
    for name, drop in (("input_ids", 0), ("inputs_embeds", 1)):
        value = kwargs.get(name)
        if isinstance(value, torch.Tensor):
            return name, tuple(value.shape[:max(0, value.dim() - drop)])
    return "input_ids", None


def check_labels(labels: Any, batch_shape: Optional[tuple[int, ...]]) -> None:
    """labels: a [B, T] tensor, the inputs' shape when known."""
    if labels is None:
        raise ValueError("return_logprobs=True needs labels (the input_ids, -100 where no log-prob is wanted)")
    wanted = "[B, T]" if batch_shape is None else str(list(batch_shape))
    if not isinstance(labels, torch.Tensor) or labels.dim() != 2 or (batch_shape is not None
                                                                     and tuple(labels.shape) != batch_shape):
        got = list(labels.shape) if isinstance(labels, torch.Tensor) else shown(labels)
        raise ValueError(f"labels must be a tensor of shape {wanted} (same as input_ids), got {got}")


def _keeps_every_logit(value: Any) -> bool:
    # transformers' default: None, or 0 (keep all); a tensor of positions or a count keeps fewer
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 0)


def check_head_call(kwargs: dict, return_logprobs: bool, lm_head_fn: Any) -> None:
    """The head modes' arguments (all by keyword, `as_keywords`), before any work."""
    mode = "return_logprobs=True" if return_logprobs else "lm_head_fn"
    for name in LOGIT_SELECTING_KWARGS:
        if not _keeps_every_logit(kwargs.get(name)):
            raise ValueError(f"{name}={shown(kwargs[name])} does not apply with {mode}: every position reaches the "
                             "head (set labels to -100 where no log-prob is wanted)")
    if lm_head_fn is not None:
        require_head_fn("lm_head_fn", lm_head_fn)
    inputs, batch_shape = _batch_shape(kwargs)
    if batch_shape is not None and (len(batch_shape) != 2 or 0 in batch_shape):
        # unbatched or empty inputs failed inside the backbone's attention
        raise ValueError(f"{inputs} must be batched, [B, T{', H' if inputs == 'inputs_embeds' else ''}] with B, "
                         f"T >= 1, with {mode}, got {list(batch_shape)}")
    if return_logprobs:
        check_labels(kwargs.get("labels"), batch_shape)
