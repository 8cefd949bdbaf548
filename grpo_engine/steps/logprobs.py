"""Per-token log-probs of the sampled completions, through `linear_logprobs` on last hidden states.

Position t-1 of the full sequence (prompt then completion) predicts completion token t, so the hidden
states of the completion's tokens are the slice [P-1, P+T-1) with P the (padded) prompt length.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Optional

import torch
from torch import nn

from grpo_kernels import linear_logprobs

from ..model.finite_forward import SCORED_HIDDEN, require_finite
from ..model.loading import HiddenStatePolicy, is_peft_model, with_lm_head
from ..rollout.base import RolloutBatch
from .packing import Pack, Packing, pack_hidden_states, plan_micro_batches


def completion_hidden_states(policy: nn.Module, batch: RolloutBatch) -> torch.Tensor:
    """[N, T, H] hidden states that predict the completion tokens (differentiable if grads are on)."""
    hidden = policy(batch.input_ids, batch.attention_mask)
    prompt_length = batch.prompt_ids.shape[1]
    return require_finite(hidden[:, prompt_length - 1: -1, :], SCORED_HIDDEN)


@torch.no_grad()
def sequence_logprobs(policy: HiddenStatePolicy, batch: RolloutBatch, temperature: float, micro_batch_size: int,
                      backend: str, disable_adapters: bool = False, packing: Optional[Packing] = None
                      ) -> torch.Tensor:
    """[N, T] float32 log-probs of the completion tokens (0 on padding), micro-batch by micro-batch, without logits;
    over the sampler's kept-token sets when the batch carries them (the reference too: its KL to the policy
    then compares the two distributions on the support the tokens were drawn from).

    With `disable_adapters` a peft policy scores as its base model: the KL reference of a LoRA run, at no
    extra memory. With `packing` the micro-batches are packs of whole sequences, or padded where those would
    cost more (grpo_engine.steps.packing.plan_micro_batches), as in the padding-free update.
    """
    lm = policy.lm
    if disable_adapters and not is_peft_model(lm):
        raise ValueError("disable_adapters needs a peft (LoRA) policy")
    context = lm.disable_adapter() if disable_adapters else nullcontext()
    logps = torch.zeros(batch.completion_ids.shape, dtype=torch.float32, device=batch.completion_ids.device)
    with context:
        for part in plan_micro_batches(batch, packing, micro_batch_size):
            if isinstance(part, Pack):
                hidden, rows = pack_hidden_states(policy, part), part
            else:
                rows = batch.select(part)
                hidden = completion_hidden_states(policy, rows)
            values = with_lm_head(lm, hidden, lambda h, weight, head: linear_logprobs(
                h, weight, rows.completion_ids, **head, temperature=temperature, backend=backend,
                mask=rows.completion_mask, kept_token_ids=rows.kept_token_ids))  # padding never goes through the head
            if isinstance(part, Pack):
                part.scatter(values, logps)
            else:
                logps[part] = values
    return logps


def reference_logprobs(policy: HiddenStatePolicy, reference: Optional[HiddenStatePolicy], batch: RolloutBatch,
                       temperature: float, micro_batch_size: int, backend: str,
                       packing: Optional[Packing] = None) -> torch.Tensor:
    """The KL reference: the frozen copy when there is one, else the LoRA policy with adapters off."""
    if reference is not None:
        return sequence_logprobs(reference, batch, temperature, micro_batch_size, backend, packing=packing)
    return sequence_logprobs(policy, batch, temperature, micro_batch_size, backend, disable_adapters=True,
                             packing=packing)
