"""The arguments of a patched forward in its head modes (`return_logprobs=True`, `lm_head_fn=`), checked before the
backbone runs.

Found by probing (each failed only after the whole backbone had run, or never): labels given positionally were
reported missing; positional arguments past the fifth reached the backbone, whose forward orders them differently
(a CausalLM's sixth is `labels`, its backbone's `use_cache`); unbatched [T] input_ids and labels failed inside
attention; a non-callable `lm_head_fn` failed as "'str' object is not callable"; `logits_to_keep` was silently
ignored, every position being scored. The other batch inputs likewise (`check_batch_inputs`): input_ids past the
embedding's rows failed as an IndexError naming nothing (a device-side assert on CUDA), an inputs_embeds of another
width or position_ids of another length failed inside the backbone, labels on the meta device inside the head, and
an attention_mask of another shape was silently not applied: the log-probs of an unmasked batch.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import torch
from torch import nn

from ..keywords import closest_name
from ..messages import shown
from ..validation import check_optional_tensors, check_targets, require_data

# Keyword arguments that shape the model's own logits; the head modes score the positions the labels select.
LOGIT_SELECTING_KWARGS = ("logits_to_keep", "num_logits_to_keep")
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
# The patched forward's own keywords. A typo of one (return_logprob=True, lm_head_func=fn, temprature=0.7) went on to
# the model's forward, whose **kwargs takes any name and ignores it: the plain logits came back, or the temperature /
# entropy asked for was silently not applied.
HEAD_MODE_KEYWORDS = ("return_logprobs", "lm_head_fn", "temperature", "return_entropy")
# As close as a one-letter slip of those; transformers' own keywords (return_loss: 0.77) stay below it.
_TYPO_CUTOFF = 0.8


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


def refuse_mistyped_head_keywords(model: nn.Module, kwargs: dict) -> None:
    """A keyword the model's forward does not name that is a typo of a head-mode keyword, refused naming the one
    meant, in every mode (before the plain forward, or the backbone, runs)."""
    named = inspect.signature(type(model).forward).parameters
    for name in kwargs:
        meant = None if name in named else closest_name(name, HEAD_MODE_KEYWORDS, cutoff=_TYPO_CUTOFF)
        if meant is not None:
            raise TypeError(f"{type(model).__name__}.forward() got an unexpected keyword argument {name!r:.60}; did "
                            f"you mean {meant!r}? (the model's own forward would take it and ignore it)")


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


def _require_data(name: str, value: Any) -> None:
    """None, or a dense tensor with values (not meta): the head modes index and read every batch input."""
    check_optional_tensors(**{name: value})
    if value is not None:
        require_data(name, value)


def _check_batch_input_shapes(kwargs: dict, batch_shape: tuple[int, ...]) -> None:
    """attention_mask [B, T] (or a 4-D [B, heads, T, T'] mask), position_ids [..., T] with B or 1 rows."""
    (batch, length), mask, positions = batch_shape, kwargs.get("attention_mask"), kwargs.get("position_ids")
    if mask is not None and not (tuple(mask.shape) == batch_shape or (mask.dim() == 4 and mask.shape[0] == batch
                                                                        and mask.shape[2] == length)):
        raise ValueError(f"attention_mask must have shape {list(batch_shape)} (same as the inputs) or be a 4-D "
                         f"[{batch}, heads, {length}, keys] mask, got {list(mask.shape)}")
    if positions is not None and (positions.dim() < 1 or positions.shape[-1] != length
                                  or (positions.dim() >= 2 and positions.shape[-2] not in (1, batch))):
        raise ValueError(f"position_ids must have shape [{batch}, {length}] (or [1, {length}]), got "
                         f"{list(positions.shape)}")


def check_batch_inputs(model: nn.Module, kwargs: dict) -> None:
    """The backbone's batch inputs in a head mode (after check_head_call), as the labels are checked: dense tensors
    with values, of the inputs' [B, T], input_ids within the input embedding's rows and inputs_embeds of its width
    (when the model says them)."""
    for name in ("input_ids", "inputs_embeds", "attention_mask", "position_ids", "labels"):
        _require_data(name, kwargs.get(name))
    _, batch_shape = _batch_shape(kwargs)
    if batch_shape is None:
        return
    _check_batch_input_shapes(kwargs, batch_shape)
    try:
        embedding = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):  # a model that does not say its embedding: ids go unchecked
        embedding = None
    rows, width = getattr(embedding, "num_embeddings", None), getattr(embedding, "embedding_dim", None)
    input_ids, embeds = kwargs.get("input_ids"), kwargs.get("inputs_embeds")
    if input_ids is not None and isinstance(rows, int):
        check_targets("input_ids", input_ids, batch_shape, rows, input_ids.device)
    if embeds is not None and isinstance(width, int) and embeds.shape[-1] != width:
        raise ValueError(f"inputs_embeds must be [{', '.join(map(str, batch_shape))}, {width}] (the input "
                         f"embedding's width), got {list(embeds.shape)}")


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
