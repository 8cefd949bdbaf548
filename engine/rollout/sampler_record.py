"""What the sampler drew from: per completion position, the log-prob of the sampled token under generation's
own processed scores and, when sampling truncates (top-k / top-p), the ids it kept.

`generate` turns the model's logits into the sampling distribution with its processors (repetition penalty,
then temperature, top-k, top-p). The trainer reproduces that distribution from hidden states: the temperature
it applies itself, the truncation it replays through `kept_token_ids` (grpo_kernels renormalises over each
position's set). The recorder runs last in the processor list, sees the processed scores of each step, and keeps
only small tensors: the kept ids ([rows, K], K the widest set of the step) and, once the next step reveals the
sampled token, its log-prob. One step's [rows, V] scores are held until then, never a [tokens, vocab] record.
"""

from __future__ import annotations

from typing import Optional

import torch
from transformers import LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, \
    TopPLogitsWarper


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
