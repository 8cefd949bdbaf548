"""A short supervised warm start for the built-in model: a random 0.1 M-parameter model never samples a
`\\boxed{}` answer, so no reward varies within a group and GRPO has nothing to learn from. A few
teacher-forced steps on the task's reference answers put the success rate where RL can raise it.

It stops at a target, not after a fixed number of steps: once the mean probability of the reference
answers (the expected sampled accuracy of answering in that form) reaches `target`. Seeds and CPUs then
hand RL comparable starting points, where a fixed step count would pass on whatever spread the floating
point of one machine gave. The negative log-likelihood comes from `linear_logprobs` too, so no logits are
formed here either.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from grpo_kernels import linear_logprobs

from ..config.schema import WARM_START_WEIGHT_DECAY
from ..model.loading import HiddenStatePolicy, with_lm_head
from ..rollout.base import RolloutBatch, mask_after_eos
from ..steps.logprobs import completion_hidden_states
from ..steps.update_checks import (WARM_START_STEP, check_update_finite, check_update_size, weight_limit,
                                   weight_sizes)


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


@dataclass
class WarmStartResult:
    losses: list[float]  # token-mean NLL per step
    answer_probability: float  # mean P(reference answer | prompt) over the prompts, after the last step


def target_logprobs(policy: HiddenStatePolicy, batch: RolloutBatch, backend: str) -> torch.Tensor:
    """[N, T] log-probs of the batch's completion tokens (zero where masked out)."""
    hidden = completion_hidden_states(policy, batch)
    logps = with_lm_head(policy.lm, hidden, lambda h, weight, head: linear_logprobs(
        h, weight, batch.completion_ids, **head, backend=backend))
    return logps * batch.completion_mask


@torch.no_grad()
def reference_answer_probability(policy: HiddenStatePolicy, batch: RolloutBatch, backend: str) -> float:
    """Mean over the rows of the probability of the whole target (EOS included) given the prompt."""
    return target_logprobs(policy, batch, backend).sum(dim=1).exp().mean().item()


def supervised_warm_start(lm: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, prompts: list[str],
                          targets: list[str], steps: int, learning_rate: float, batch_size: int, seed: int,
                          device: torch.device, backend: str = "auto", target: float = 1.0,
                          check_every: int = 10) -> WarmStartResult:
    """Up to `steps` AdamW steps of token-mean NLL on random (prompt, target) pairs, stopping early once
    the mean reference-answer probability over all prompts reaches `target` (checked every `check_every`)."""
    if not 0.0 < target <= 1.0:
        raise ValueError(f"warm start target must be in (0, 1], got {target}")
    policy = HiddenStatePolicy(lm).train()
    trained = [p for p in lm.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=learning_rate, weight_decay=WARM_START_WEIGHT_DECAY)
    largest, norm = weight_sizes(None, trained)
    limit = weight_limit(largest)
    every_prompt = teacher_forced_batch(tokenizer, prompts, targets, device)
    order = random.Random(seed)
    losses: list[float] = []
    probability = reference_answer_probability(policy, every_prompt, backend)
    while len(losses) < steps and probability < target:
        rows = [order.randrange(len(prompts)) for _ in range(batch_size)]
        batch = teacher_forced_batch(tokenizer, [prompts[i] for i in rows], [targets[i] for i in rows], device)
        loss = -target_logprobs(policy, batch, backend).sum() / batch.completion_mask.sum()
        loss.backward()
        grad_norm = float(torch.nn.utils.get_total_norm([p.grad for p in trained if p.grad is not None]))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        # the RL update's checks on the weights RL starts from: a learning rate that wrecks them stops here, naming
        # run.warm_start_learning_rate, not at step 1 as a NaN forward of a model whose weights look finite
        largest, norm_after = weight_sizes(None, trained)
        check_update_finite(largest, limit, len(losses), learning_rate, 0.0, grad_norm, WARM_START_STEP)
        check_update_size(norm, norm_after, len(losses), learning_rate, grad_norm, WARM_START_STEP)
        norm = norm_after
        if len(losses) % check_every == 0 or len(losses) == steps:
            probability = reference_answer_probability(policy, every_prompt, backend)
    return WarmStartResult(losses, probability)
