"""The rollout backends' one interface: prompts in; completion ids, the sampler's log-probs and kept sets out.

A backend (hf.py: Hugging Face `generate` on the policy itself; vllm.py: a colocated vLLM engine) turns rendered
prompts into a `RolloutBatch`. The pieces every backend shares live here: how prompts are tokenized (left-padded,
left-truncated, no special tokens added) and how raw completion ids become the batch's masks, so the trainer sees
the same tensors whichever backend sampled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase

from ..config import RolloutConfig


class RolloutBackend(Protocol):
    """What the trainer and the evaluation ask of a sampler."""

    def generate(self, prompts: list[str], greedy: bool = False, record_kept: bool = False) -> "RolloutBatch":
        """One completion per prompt (the caller repeats each prompt G times). Sampling fills `sampler_logps`;
        `record_kept` also fills `kept_token_ids` (the ids top-k / top-p kept at each position)."""
        ...

    def sync_weights(self, version: int = 0) -> None:
        """Called after every optimizer round: the next `generate` samples from the updated policy, which holds
        `version` rounds."""
        ...


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
    # the optimizer rounds the sampler's weights held when it drew each completion; -1: unknown (never trained on);
    # None: the backend samples from the policy itself (always the current version)
    policy_version: Optional[torch.Tensor] = None  # [N] long

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
                            self.truncated[rows], part(self.sampler_logps), part(self.kept_token_ids),
                            part(self.policy_version))


def mask_after_eos(completion_ids: torch.Tensor, eos_token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention mask up to and including the first EOS, truncated flag per row)."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_token_ids, device=completion_ids.device))
    has_eos = is_eos.any(dim=1)
    length = completion_ids.shape[1]
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, length, dtype=torch.long))
    positions = torch.arange(length, device=completion_ids.device)[None, :]
    return (positions <= first_eos[:, None]).long(), ~has_eos


def eos_ids(tokenizer: PreTrainedTokenizerBase, generation_config: GenerationConfig) -> list[int]:
    ids = generation_config.eos_token_id if generation_config.eos_token_id is not None else tokenizer.eos_token_id
    return list(ids) if isinstance(ids, (list, tuple)) else [ids]


def encode_prompts(tokenizer: PreTrainedTokenizerBase, prompts: list[str], max_prompt_length: Optional[int],
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [N, P] left-padded, mask [N, P]); over-long prompts keep their last max_prompt_length tokens."""
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left",
                        truncation=max_prompt_length is not None, max_length=max_prompt_length,
                        add_special_tokens=False)
    return encoded["input_ids"].to(device), encoded["attention_mask"].to(device)


def finish_batch(tokenizer: PreTrainedTokenizerBase, prompts: list[str], prompt_ids: torch.Tensor,
                 prompt_mask: torch.Tensor, completion_ids: torch.Tensor, eos: list[int], config: RolloutConfig,
                 sampler_logps: Optional[torch.Tensor], kept: Optional[torch.Tensor]) -> RolloutBatch:
    """A RolloutBatch from raw completion ids [N, T]: everything past the first EOS becomes padding (and gets no
    sampler log-prob or kept set), the loss mask follows mask_truncated_completions, the text is decoded."""
    attention, truncated = mask_after_eos(completion_ids, eos)
    padding = torch.full_like(completion_ids, tokenizer.pad_token_id)
    completion_ids = torch.where(attention.bool(), completion_ids, padding)
    loss_mask = attention.clone()
    if config.mask_truncated_completions:
        loss_mask[truncated] = 0
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    if sampler_logps is not None:
        sampler_logps = sampler_logps * attention
    if kept is not None:
        kept = torch.where(attention[..., None].bool(), kept, torch.full_like(kept, -1))
    return RolloutBatch(list(prompts), texts, prompt_ids, prompt_mask, completion_ids, attention, loss_mask, truncated,
                        sampler_logps, kept)
