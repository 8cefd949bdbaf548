"""The `hf` rollout backend: G completions per prompt with Hugging Face `generate` on the policy itself.

It samples from the very module the optimizer updates, so there is nothing to sync. What the sampler drew from
is recorded per completion position: the log-prob of the sampled token under generation's own processed scores
and, when sampling truncates (top-k / top-p), the ids it kept.
own processed scores and, when sampling truncates (top-k / top-p), the ids it kept.

`generate` turns the model's logits into the sampling distribution with its processors (repetition penalty,
then temperature, top-k, top-p). The trainer reproduces that distribution from hidden states: the temperature
it applies itself, the truncation it replays through `kept_token_ids` (grpo_kernels renormalises over each
position's set). The recorder runs last in the processor list, sees the processed scores of each step, and keeps
only small tensors: the kept ids ([rows, K], K the widest set of the step) and, once the next step reveals the
sampled token, its log-prob. One step's [rows, V] scores are held until then, never a [tokens, vocab] record.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, PreTrainedTokenizerBase, \
    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from ..config import RolloutConfig
from ..model.finite_forward import FiniteLogits
from .base import RolloutBatch, encode_prompts, eos_ids, finish_batch


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


def truncates(top_p: float, top_k: int) -> bool:
    return top_p < 1.0 or top_k > 0


def kept_ids(scores: torch.Tensor) -> torch.Tensor:
    """[rows, V] processed scores (-inf where a processor removed the token) -> [rows, K] kept ids, -1 padding."""
    kept = scores > float("-inf")
    width = max(1, int(kept.sum(-1).max()))
    order = torch.argsort(kept.to(torch.int8), dim=-1, descending=True, stable=True)[:, :width]
    return torch.where(kept.gather(-1, order), order, torch.full_like(order, -1))


class SamplerRecorder(LogitsProcessor):
    """A logits processor that changes nothing and records the sampler's view of each step."""

    def __init__(self, record_kept: bool):
        self.record_kept = record_kept
        self.logps: list[torch.Tensor] = []  # per step [rows]
        self.kept: list[torch.Tensor] = []  # per step [rows, K_step]
        self._pending: Optional[torch.Tensor] = None  # the last step's log-softmax, until its token is known

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._pending is not None:
            self._close_step(input_ids[:, -1])
        self._pending = torch.log_softmax(scores.float(), dim=-1)
        if self.record_kept:
            self.kept.append(kept_ids(scores))
        return scores

    def _close_step(self, sampled: torch.Tensor) -> None:
        self.logps.append(self._pending.gather(-1, sampled[:, None]).squeeze(-1))
        self._pending = None

    def finish(self, completion_ids: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(sampler log-probs [rows, T], kept ids [rows, T, K] or None) for the generated completion_ids [rows, T]."""
        if self._pending is not None:
            self._close_step(completion_ids[:, len(self.logps)])
        T = completion_ids.shape[1]
        rows = completion_ids.shape[0]
        logps = torch.zeros(rows, T, device=completion_ids.device)
        if self.logps:
            logps[:, :len(self.logps)] = torch.stack(self.logps, dim=1)
        if not self.record_kept:
            return logps, None
        width = max([k.shape[1] for k in self.kept], default=1)
        kept = torch.full((rows, T, width), -1, dtype=torch.int64, device=completion_ids.device)
        for t, ids in enumerate(self.kept[:T]):
            kept[:, t, :ids.shape[1]] = ids
        return logps, kept


def sampling_processors(temperature: float, top_k: int, top_p: float, recorder: SamplerRecorder
                        ) -> LogitsProcessorList:
    """Temperature, top-k, top-p (transformers' own warpers, in generate's order), then the recorder. Passed to
    `generate` with its own warpers off, so the recorder sees the final scores in every transformers version
    (which merge custom processors before or after their warpers)."""
    processors = LogitsProcessorList()
    if temperature != 1.0:
        processors.append(TemperatureLogitsWarper(temperature))
    if top_k > 0:
        processors.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
    if top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
    processors.append(recorder)
    return processors


@torch.no_grad()
def generate_completions(lm: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, prompts: list[str],
                         config: RolloutConfig, max_prompt_length: int | None, device: torch.device,
                         greedy: bool = False, record_kept: bool = False) -> RolloutBatch:
    """One completion per entry of `prompts` (the caller repeats each prompt G times). Sampling records each
    token's sampler log-prob and, with `record_kept`, the ids top-k / top-p kept (SamplerRecorder)."""
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts, max_prompt_length, device)
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
    finite_logits = FiniteLogits()
    processors.insert(0, finite_logits)  # before any processor reads them
    was_training = lm.training
    lm.eval()
    try:
        with sampling_by_the_rollout_settings(lm):
            output = lm.generate(input_ids=prompt_ids, attention_mask=prompt_mask,
                                 generation_config=generation_config, logits_processor=processors)
    finally:
        lm.train(was_training)
    finite_logits.raise_if_seen()
    completion_ids = output[:, prompt_ids.shape[1]:]
    if completion_ids.shape[1] == 0:  # every prompt hit EOS at once is impossible; guard the empty slice anyway
        completion_ids = torch.full((len(prompts), 1), tokenizer.pad_token_id, device=device)
    sampler_logps, kept = (None, None) if recorder is None else recorder.finish(completion_ids)
    return finish_batch(tokenizer, prompts, prompt_ids, prompt_mask, completion_ids, eos, config, sampler_logps, kept)


# What generate may keep of a model's own generation config: the token ids (the EOS ids are read from it above).
_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


@contextmanager
def sampling_by_the_rollout_settings(lm: torch.nn.Module) -> Iterator[None]:
    """While `generate` runs, the model's own generation config (its generation_config.json) holds only its token ids.

    generate fills every setting the engine's GenerationConfig leaves unset from the model's own: a model directory's
    `min_p`, `no_repeat_ngram_size`, `min_new_tokens`, `suppress_tokens` or `bad_words_ids` changed what was sampled
    without a word (the loss then scored another distribution than the sampler's), and `num_beams` or
    `prompt_lookup_num_tokens` failed inside generate at step 1. The rollout settings alone decide the sampling."""
    owners = [module for module in lm.modules()
              if isinstance(module.__dict__.get("generation_config"), GenerationConfig)]
    saved = [module.__dict__["generation_config"] for module in owners]
    for module, own in zip(owners, saved):
        module.generation_config = GenerationConfig(
            **{key: getattr(own, key) for key in _TOKEN_IDS if getattr(own, key, None) is not None})
    try:
        yield
    finally:
        for module, own in zip(owners, saved):
            module.generation_config = own


class HFRollout:
    """Samples with `generate` from the policy module itself (under FSDP the sharded policy, whose `generate`
    gathers the layers first): the optimizer's updates are what it samples from, so `sync_weights` has nothing
    to do."""

    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, config: RolloutConfig,
                 max_prompt_length: Optional[int], device: torch.device) -> None:
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.max_prompt_length, self.device = max_prompt_length, device

    def generate(self, prompts: list[str], greedy: bool = False, record_kept: bool = False) -> RolloutBatch:
        return generate_completions(self.model, self.tokenizer, prompts, self.config, self.max_prompt_length,
                                    self.device, greedy=greedy, record_kept=record_kept)

    def sync_weights(self, version: int = 0) -> None:
        pass


def create(context) -> HFRollout:
    """The rollout registry's factory (registry.py)."""
    config = context.config
    return HFRollout(context.generation_model, context.tokenizer, config.rollout, config.data.max_prompt_length,
                     context.device)
