"""The interface every backend implements, and the dtype its statistics come in.

A backend streams the logits of an LM head (head.py's LMHead: weight, bias, temperature, transform) over hidden
rows, in two calls: the forward gives each row's log-prob of its target, the entropy and the log-sum-exp; the
backward turns per-row g = dLoss/dlp and e = dLoss/dent into the gradients of hidden, weight and bias. Everything
a loss needs from the logits passes through these two calls (objective.py), so a backend knows nothing of the
loss, and the wrappers (kept_tokens.KeptTokenHead, vocab_parallel's shard) compose with any backend.

A backend whose registry entry declares a token-level route (backends/__init__.py: ONE_PASS, EPILOGUE) also
implements that route's method: OnePassBackend or EpilogueBackend below.
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol, runtime_checkable

import torch

from ..head import LMHead


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of every backend's statistics and softmax math: float32, float64 for float64 inputs (the oracle)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@runtime_checkable
class LogprobBackend(Protocol):
    def linear_forward(self, hidden: torch.Tensor, head: LMHead, targets: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """hidden [N, H], head.weight [V, H], targets [N] (ids outside [0, V): no target logit, as on a shard) ->
        (logps, entropy, lse), each [N] in stats_dtype(hidden.dtype)."""
        ...

    def linear_backward(self, grad_logps: torch.Tensor, grad_entropy: Optional[torch.Tensor], hidden: torch.Tensor,
                        head: LMHead, targets: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor,
                        needs_hidden_grad: bool = True, needs_weight_grad: bool = True
                        ) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
        """(dhidden, dweight, dbias) from g [N] and e [N] (None: no entropy term), with the forward's lse and entropy
        (a vocabulary shard passes the whole vocabulary's); None where not needed (dbias follows dweight)."""
        ...


@runtime_checkable
class LogitsBackend(Protocol):
    """The same statistics and gradient when the caller already holds the logits [B, T, V]."""

    def logits_forward(self, logits: torch.Tensor, targets: torch.Tensor, temperature: float
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ...

    def logits_backward(self, grad_logps: torch.Tensor, grad_entropy: Optional[torch.Tensor], logits: torch.Tensor,
                        targets: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor, temperature: float
                        ) -> torch.Tensor:
        ...


@runtime_checkable
class OnePassBackend(Protocol):
    """The ONE_PASS route: the statistics and the gradients of a token-level objective in one streaming pass."""

    def linear_forward_with_grads(self, hidden: torch.Tensor, head: LMHead, targets: torch.Tensor,
                                  token_grads: Callable, needs_hidden_grad: bool = True,
                                  needs_weight_grad: bool = True, combine_stats: Optional[Callable] = None
                                  ) -> tuple[torch.Tensor, ...]:
        """`token_grads(n0, n1, logps, entropy) -> (g, e)` for rows [n0, n1) as soon as their statistics exist
        (combined over a vocabulary shard by `combine_stats(lse, entropy, target_logit)` when given) ->
        (logps, entropy, lse, dhidden, dweight, dbias), gradients None where not needed."""
        ...


@runtime_checkable
class EpilogueBackend(Protocol):
    """The EPILOGUE route: the token-level objective in the forward kernel's epilogue; the backward is the
    backend's linear_backward with g and e from the epilogue."""

    def linear_grpo_forward(self, hidden: torch.Tensor, head: LMHead, targets: torch.Tensor,
                            advantages: torch.Tensor, token_weights: torch.Tensor,
                            entropy_weights: Optional[torch.Tensor], old_logps: Optional[torch.Tensor],
                            ref_logps: Optional[torch.Tensor], importance_ratio: Optional[torch.Tensor],
                            mask: torch.Tensor, objective) -> tuple[torch.Tensor, ...]:
        """Rows [N] and the objective's constants (kernels/token_objective.epilogue_args) -> (terms, logps,
        entropy, lse, g, kl, clip code)."""
        ...


@runtime_checkable
class SequenceWavesBackend(Protocol):
    """A loss separable by sequence in one pass over waves of whole sequences (BackendSpec.sequence_waves;
    sequence_route.py): the statistics of each wave's rows, then the gradients from the wave's g."""

    def sequence_store_rows(self, rows: int, vocab: int, hidden: torch.Tensor) -> int:
        """How many rows of a call of `rows` rows the workspace's store holds: the longest sequence it may take."""
        ...

    def linear_forward_with_sequence_grads(self, hidden: torch.Tensor, head: LMHead, targets: torch.Tensor,
                                           waves: list[tuple[int, int]], wave_grads: Callable,
                                           needs_hidden_grad: bool = True, needs_weight_grad: bool = True
                                           ) -> tuple[torch.Tensor, ...]:
        """`wave_grads(r0, r1, logps, entropy) -> g` of rows [r0, r1) once every row up to r1 has its statistics
        -> (logps, entropy, lse, dhidden, dweight, dbias), gradients None where not needed."""
        ...
