"""Sampling G completions per prompt with Hugging Face `generate` (left-padded prompts, EOS-aware masks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, PreTrainedTokenizerBase

from .config import RolloutConfig
from .sampler_record import SamplerRecorder, sampling_processors


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


class PaddedVocabMask(LogitsProcessor):
    """Removes the ids past the tokenizer's last token from sampling: the rows a model's vocabulary was padded
    with (Qwen2.5: 151,936 rows for about 151,665 tokens) decode to nothing, so the rewards would score text
    without them. A no-op when the vocabulary has no such rows."""

    def __init__(self, tokenizer_size: int) -> None:
        self.tokenizer_size = tokenizer_size

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if scores.shape[-1] > self.tokenizer_size:
            scores[:, self.tokenizer_size:] = float("-inf")
        return scores


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


@torch.no_grad()
def generate_completions(lm: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, prompts: list[str],
                         config: RolloutConfig, max_prompt_length: int | None, device: torch.device,
                         greedy: bool = False, record_kept: bool = False) -> RolloutBatch:
    """One completion per entry of `prompts` (the caller repeats each prompt G times). Sampling records each
    token's sampler log-prob and, with `record_kept`, the ids top-k / top-p kept (sampler_record.py)."""
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left",
                        truncation=max_prompt_length is not None, max_length=max_prompt_length,
                        add_special_tokens=False)
    prompt_ids, prompt_mask = encoded["input_ids"].to(device), encoded["attention_mask"].to(device)
    base_generation = getattr(lm, "generation_config", None) or GenerationConfig()
    eos = eos_ids(tokenizer, base_generation)
    # Sampling: temperature, top-k and top-p are our processors (generate's own warpers off), so the recorder
    # after them sees the scores the token is drawn from.
    generation_config = GenerationConfig(
        do_sample=not greedy, temperature=1.0 if not greedy else None, top_p=1.0 if not greedy else None,
        top_k=0 if not greedy else None, repetition_penalty=config.repetition_penalty,
        max_new_tokens=config.max_new_tokens, pad_token_id=tokenizer.pad_token_id, eos_token_id=eos, use_cache=True,
    )
    recorder = None if greedy else SamplerRecorder(record_kept)
    processors = LogitsProcessorList() if greedy else sampling_processors(config.temperature, config.top_k,
                                                                          config.top_p, recorder)
    if not config.sample_padded_vocab:  # first: the recorder and the kept sets then see them removed too
        processors.insert(0, PaddedVocabMask(len(tokenizer)))
    was_training = lm.training
    lm.eval()
    try:
        output = lm.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=generation_config,
                             logits_processor=processors)
    finally:
        lm.train(was_training)
    completion_ids = output[:, prompt_ids.shape[1]:]
    if completion_ids.shape[1] == 0:  # every prompt hit EOS at once is impossible; guard the empty slice anyway
        completion_ids = torch.full((len(prompts), 1), tokenizer.pad_token_id, device=device)
    sampler_logps, kept = (None, None) if recorder is None else recorder.finish(completion_ids)
    attention, truncated = mask_after_eos(completion_ids, eos)
    # Tokens past the first EOS are padding whatever `generate` put there.
    padding = torch.full_like(completion_ids, tokenizer.pad_token_id)
    completion_ids = torch.where(attention.bool(), completion_ids, padding)
    loss_mask = attention.clone()
    if config.mask_truncated_completions:
        loss_mask[truncated] = 0
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    if sampler_logps is not None:
        sampler_logps = sampler_logps * attention
    if kept is not None:  # past the first EOS nothing was sampled
        kept = torch.where(attention[..., None].bool(), kept, torch.full_like(kept, -1))
    return RolloutBatch(list(prompts), texts, prompt_ids, prompt_mask, completion_ids, attention, loss_mask, truncated,
                        sampler_logps, kept)
