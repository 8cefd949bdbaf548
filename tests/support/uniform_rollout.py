"""A rollout backend of a test's own (grpo_engine/rollout/registry.py: a module and one entry): completions of tokens
drawn uniformly from the tokenizer's vocabulary (the special ones but EOS left out), without the policy. Its sampler's
log-prob of each token is log(1 / the ids it draws from)."""

from __future__ import annotations

import math

import torch

from grpo_engine.rollout.base import RolloutBatch, encode_prompts, finish_batch

GENERATED: list[int] = []  # completions generated, per call: the test sees the trainer used this backend


class UniformRollout:
    def __init__(self, tokenizer, config, device) -> None:
        self.tokenizer, self.config, self.device = tokenizer, config, device
        special = set(tokenizer.all_special_ids) - {tokenizer.eos_token_id}
        self.ids = torch.tensor([i for i in range(len(tokenizer)) if i not in special])

    def generate(self, prompts: list[str], greedy: bool = False, record_kept: bool = False) -> RolloutBatch:
        prompt_ids, prompt_mask = encode_prompts(self.tokenizer, prompts, self.config.data.max_prompt_length,
                                                 self.device)
        length = self.config.rollout.max_new_tokens
        picks = torch.zeros(len(prompts), length, dtype=torch.long) if greedy else \
            torch.randint(len(self.ids), (len(prompts), length))
        completion_ids = self.ids[picks].to(self.device)
        logps = torch.full(completion_ids.shape, -math.log(len(self.ids)), device=self.device)
        GENERATED.append(len(prompts))
        return finish_batch(self.tokenizer, prompts, prompt_ids, prompt_mask, completion_ids,
                            [self.tokenizer.eos_token_id], self.config.rollout, None if greedy else logps, None)

    def sync_weights(self, version: int = 0) -> None:
        pass  # it reads no weights


def create(context) -> UniformRollout:
    return UniformRollout(context.tokenizer, context.config, context.device)
