"""A short supervised warm start for the built-in model: a random 0.1 M-parameter model never samples a
`\\boxed{}` answer, so no reward varies within a group and GRPO has nothing to learn from. A few
teacher-forced steps on the task's reference answers put the success rate where RL can raise it.
The negative log-likelihood comes from `linear_logprobs` too, so no logits are formed here either.
"""

from __future__ import annotations

import random

import torch
from transformers import PreTrainedTokenizerBase

from grpo_kernels import linear_logprobs

from .logprobs import completion_hidden_states
from .models import HiddenStatePolicy, with_lm_head
from .rollout import RolloutBatch, mask_after_eos


def teacher_forced_batch(tokenizer: PreTrainedTokenizerBase, prompts: list[str], targets: list[str],
                         device: torch.device) -> RolloutBatch:
    """Prompts left-padded, `target + EOS` right-padded: the layout of a sampled batch."""
    prompt = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    answer = tokenizer([t + tokenizer.eos_token for t in targets], return_tensors="pt", padding=True,
                       padding_side="right", add_special_tokens=False)
    completion_ids = answer["input_ids"].to(device)
    attention, truncated = mask_after_eos(completion_ids, [tokenizer.eos_token_id])
    return RolloutBatch(list(prompts), list(targets), prompt["input_ids"].to(device),
                        prompt["attention_mask"].to(device), completion_ids, attention, attention.clone(), truncated)


def supervised_warm_start(lm: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, prompts: list[str],
                          targets: list[str], steps: int, learning_rate: float, batch_size: int, seed: int,
                          device: torch.device, backend: str = "auto") -> list[float]:
    """`steps` AdamW steps of token-mean NLL on random (prompt, target) pairs; returns the losses."""
    policy = HiddenStatePolicy(lm).train()
    optimizer = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=learning_rate)
    order = random.Random(seed)
    losses = []
    for _ in range(steps):
        rows = [order.randrange(len(prompts)) for _ in range(batch_size)]
        batch = teacher_forced_batch(tokenizer, [prompts[i] for i in rows], [targets[i] for i in rows], device)
        hidden = completion_hidden_states(policy, batch)
        logps = with_lm_head(lm, hidden, lambda h, weight, bias: linear_logprobs(
            h, weight, batch.completion_ids, bias=bias, backend=backend))
        mask = batch.completion_mask.float()
        loss = -(logps * mask).sum() / mask.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses
