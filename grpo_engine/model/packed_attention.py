"""sdpa that runs each packed sequence on its own: the attention of a pack costs what its sequences cost.

Under transformers' sdpa a pack of L tokens (packed sequences: one row, position ids restarting at 0, no 2-D
mask) gets a dense block-diagonal [L, L] mask, so its attention costs L^2 whatever the sequences in it, and on a
CPU that outweighs the padding the pack saves once the padded batch is mostly real tokens. Registered with
transformers' AttentionInterface as PER_SEQUENCE_SDPA (its mask is sdpa's own), this attention checks that the
mask the model built is exactly causal within each sequence of the pack and then calls transformers' sdpa once
per sequence, causal and unmasked: sum of l_i^2 / 2 instead of L^2 (torch's CPU and GPU sdpa kernels skip the
blocks above the diagonal). Any other input (padded batches, generation with a cache, sliding-window or chunked
masks that cut a sequence, position biases) goes to transformers' sdpa unchanged, mask and all.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

PER_SEQUENCE_SDPA = "sdpa_per_sequence"
CHECK_ROWS = 1024  # mask rows compared at once


class _LastMask:
    """The sequence bounds found for the last mask seen: every layer of a forward gets the same mask tensor, so
    the O(L^2) check runs once per forward and mask (a sliding-window layer's mask is another tensor)."""

    def __init__(self) -> None:
        self.mask: Optional[weakref.ref] = None
        self.bounds: Optional[list[int]] = None

    def lookup(self, mask: torch.Tensor, position_ids: torch.Tensor) -> Optional[list[int]]:
        if self.mask is None or self.mask() is not mask:
            self.mask, self.bounds = weakref.ref(mask), per_sequence_bounds(mask, position_ids)
        return self.bounds


_last_mask = _LastMask()


def per_sequence_bounds(mask: torch.Tensor, position_ids: torch.Tensor) -> Optional[list[int]]:
    """[0, s_1, ..., L]: where the pack's sequences start (position id 0, then counting up by 1), when the model's
    mask [1, 1, L, L] (bool: True attends; float: 0 attends) is exactly causal within each of them and nothing
    across; else None."""
    length = position_ids.shape[-1]
    if position_ids.shape != (1, length) or mask.shape[-2:] != (length, length) or mask.shape[0] != 1:
        return None
    positions = position_ids[0]
    first = positions == 0
    counts_up = torch.cat([first[:1], positions[1:] == positions[:-1] + 1])
    if not bool((first | counts_up).all()) or not bool(first[0]):
        return None
    sequence = torch.cumsum(first.long(), 0)
    index = torch.arange(length, device=positions.device)
    for start in range(0, length, CHECK_ROWS):  # in row blocks: no second [L, L] tensor beside the mask
        rows = slice(start, start + CHECK_ROWS)
        expected = (sequence[rows, None] == sequence[None, :]) & (index[None, :] <= index[rows, None])
        block = mask[..., rows, :]
        if not bool(((block if block.dtype == torch.bool else block == 0) == expected).all()):
            return None
    return [*first.nonzero().flatten().tolist(), length]


def per_sequence_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature ([B, heads, L, D] in, [B, L, heads, D] out)."""
    position_ids = kwargs.get("position_ids")
    bounds = None
    if (attention_mask is not None and position_ids is not None and kwargs.get("position_bias") is None
            and query.shape[2] == key.shape[2]):
        bounds = _last_mask.lookup(attention_mask, position_ids)
    if bounds is None or len(bounds) < 3:  # not a pack of 2 or more sequences confined by the mask
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    kwargs = {name: value for name, value in kwargs.items() if name not in ("is_causal", "position_ids")}
    outputs = [sdpa_attention_forward(module, query[:, :, start:end], key[:, :, start:end], value[:, :, start:end],
                                      None, is_causal=True, **kwargs)[0]
               for start, end in zip(bounds[:-1], bounds[1:])]
    return torch.cat(outputs, dim=1), None


AttentionInterface.register(PER_SEQUENCE_SDPA, per_sequence_sdpa)
AttentionMaskInterface.register(PER_SEQUENCE_SDPA, sdpa_mask)


def use_per_sequence_attention(lm: nn.Module) -> bool:
    """Switches a model running transformers' sdpa to PER_SEQUENCE_SDPA (the same results; packs cost their
    sequences); True if it runs it now. Other implementations are left as they are."""
    config = lm.config
    if config._attn_implementation == PER_SEQUENCE_SDPA:
        return True
    if config._attn_implementation != "sdpa":
        return False
    lm.set_attn_implementation(PER_SEQUENCE_SDPA)
    return config._attn_implementation == PER_SEQUENCE_SDPA
