"""What the one-pass route (ONE_PASS: a token-level objective's gradients computed per wave in the forward) shares
between the custom op that runs it on a whole head (ops.py) and the vocabulary-parallel wrapper that runs it on a
shard (vocab_parallel.py): the per-wave objective callback and the custom ops' "not computed" placeholder."""

from __future__ import annotations

from typing import Optional

import torch

from ..config import GRPOLossConfig
from ..objective import TokenInputs, token_level_step


def token_step_per_wave(inputs: TokenInputs, config: GRPOLossConfig, n_rows: int, device: torch.device):
    """(token_grads, outputs): the one-pass stream's per-wave callback evaluating the objective once per token
    (token_level_step), and the [N] tensors (terms, kl, clip) it fills as the waves pass."""
    terms = torch.zeros(n_rows, dtype=torch.float32, device=device)
    kl, clip = torch.zeros_like(terms), torch.zeros(n_rows, dtype=torch.int8, device=device)

    def token_grads(n0: int, n1: int, logps: torch.Tensor, entropy: torch.Tensor):
        step = token_level_step(logps, entropy, inputs.slice(n0, n1), config)
        terms[n0:n1], kl[n0:n1], clip[n0:n1] = step.terms, step.kl, step.clip
        return step.grad_logps, step.grad_entropy

    return token_grads, (terms, kl, clip)


def or_empty(x: Optional[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """`x`, or the placeholder a custom op returns for a gradient it did not compute (custom ops cannot return
    None): a 1-D empty tensor, which no real gradient is (each has its input's shape, [0, H] included)."""
    return x if x is not None else like.new_empty(0)
