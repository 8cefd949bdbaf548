"""The Hugging Face rollout backend: G completions per prompt with `generate` (left-padded prompts, EOS-aware
masks), recording what the sampler drew from (sampler_record.py)."""

from __future__ import annotations

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase

from ..config import RolloutConfig
from .base import RolloutBatch, mask_after_eos
from .sampler_record import SamplerRecorder, sampling_processors


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
    processors = None if greedy else sampling_processors(config.temperature, config.top_k, config.top_p, recorder)
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
