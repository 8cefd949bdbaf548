"""What every rollout backend returns: G completions per prompt as token ids and masks (`RolloutBatch`), with
the sampler's own log-probs and kept-token sets when it records them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class RolloutBatch:
    prompts: list[str]  # [N] rendered prompt text, each repeated for its completions
    completions: list[str]  # [N] decoded completion text (special tokens removed)
    prompt_ids: torch.Tensor  # [N, P] left-padded
    prompt_mask: torch.Tensor  # [N, P]
    completion_ids: torch.Tensor  # [N, T] right-padded
    completion_attention: torch.Tensor  # [N, T] 1 up to and including the first EOS
    completion_mask: torch.Tensor  # [N, T] the loss mask (zero for truncated ones when configured)
    truncated: torch.Tensor  # [N] bool: no EOS within max_new_tokens
    # the sampler's log-prob of each completion token under generate's processed scores (0 on padding)
    sampler_logps: Optional[torch.Tensor] = None  # [N, T]
    # the ids a truncating sampler kept at each position (-1 padding; -1 everywhere on padding positions)
    kept_token_ids: Optional[torch.Tensor] = None  # [N, T, K]

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.completion_attention], dim=1)

    def token_ids_lists(self) -> list[list[int]]:
        return [ids[mask.bool()].tolist() for ids, mask in zip(self.completion_ids, self.completion_attention)]

    def select(self, rows: slice) -> "RolloutBatch":
        def part(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return None if x is None else x[rows]

        return RolloutBatch(self.prompts[rows], self.completions[rows], self.prompt_ids[rows], self.prompt_mask[rows],
                            self.completion_ids[rows], self.completion_attention[rows], self.completion_mask[rows],
                            self.truncated[rows], part(self.sampler_logps), part(self.kept_token_ids))


def mask_after_eos(completion_ids: torch.Tensor, eos_token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention mask up to and including the first EOS, truncated flag per row)."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_token_ids, device=completion_ids.device))
    has_eos = is_eos.any(dim=1)
    length = completion_ids.shape[1]
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, length, dtype=torch.long))
    positions = torch.arange(length, device=completion_ids.device)[None, :]
    return (positions <= first_eos[:, None]).long(), ~has_eos
