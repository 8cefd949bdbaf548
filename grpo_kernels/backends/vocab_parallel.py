"""Vocabulary-parallel LM heads: each rank of a process group holds the rows W[v0:v1] of the head.

A wrapper around any backend of the Protocol (protocol.py): the backend streams the local shard (the LMHead with
this rank's rows, its transform and temperature included) with local targets (global id - v0, and -1 where the
target lives on another rank, which every backend reads as "no target logit here"), then the per-token statistics
of the shards are combined:

- all-reduce MAX of the local log-sum-exps lse_r            -> m                (1 float per token)
- all-reduce SUM of [exp(lse_r - m), exp(lse_r - m) * (lse_r - ent_r), z_y]   (3 floats per token)

lse = m + log(sum exp(lse_r - m)); E[z] = sum_r exp(lse_r - lse) (lse_r - ent_r) since lse_r - ent_r is the mean
logit under the shard's own softmax; entropy = lse - E[z]; lp = z_y - lse (z_y, the target logit, is nonzero on
the owning rank only). Two collectives rather than one all-gather of (lse_r, ent_r, z_y): the all-gather moves
3 x world floats per token, growing with the group, and a hand-written fused MAX/SUM needs a custom reduction
that torch.distributed (NCCL, gloo) does not offer; the MAX is 1 float per token, its latency is the only cost.

Backward: the backend's `linear_backward` on the local shard with the GLOBAL lse and entropy and the local
targets is exactly the shard's slice of dZ, so dW and dbias are local (no communication) and dH is a partial
sum: one all-reduce SUM of dH. A backend's ONE_PASS route (gradients in the forward; backends/__init__.py)
combines per wave, between the row statistics and g/e, through its `combine_stats` hook (protocol.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from ..head import LMHead
from ..objective import TokenInputs
from ..second_order import refuse_second_order
from . import ONE_PASS, get_backend
from .gemm import wave_rows
from .kept_tokens import KeptTokenHead, local_kept_ids, rows_with_set
from .one_pass import or_empty, token_step_per_wave

try:  # DTensor is public from torch 2.5; older builds only take the process_group form
    from torch.distributed.tensor import DTensor, Shard
except ImportError:  # pragma: no cover
    DTensor = Shard = None


def is_dtensor(x: object) -> bool:
    return DTensor is not None and isinstance(x, DTensor)


@dataclass(frozen=True)
class VocabShard:
    """This rank's place in a vocabulary-parallel head: rows [offset, offset + sizes[rank]) of vocab_size."""

    group: object  # a torch.distributed ProcessGroup
    sizes: tuple[int, ...]  # every rank's number of vocabulary rows, in group rank order
    rank: int

    @property
    def offset(self) -> int:
        return sum(self.sizes[:self.rank])

    @property
    def vocab_size(self) -> int:
        return sum(self.sizes)

    def local_targets(self, targets: torch.Tensor) -> torch.Tensor:
        """Global token ids -> ids in this shard, -1 for the ids another rank holds."""
        local = targets - self.offset
        return torch.where((local >= 0) & (local < self.sizes[self.rank]), local, torch.full_like(local, -1))

    def wave_workspace(self, workspace_bytes: int) -> int:
        """A workspace giving this rank the same tokens per GEMM wave as every other rank (the per-wave combine
        is a collective: all ranks must run the same number of waves, whatever their shard's size)."""
        return wave_rows(max(self.sizes), workspace_bytes) * 4 * self.sizes[self.rank]

    def combine_stats(self, lse: torch.Tensor, entropy: torch.Tensor, target_z: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Local (lse, entropy, target logit or 0) [n] -> the same over the whole vocabulary, on every rank."""
        m = lse.clone()
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=self.group)
        w = torch.exp(lse - m)
        # a shard with no logit in a row's support (a kept-token set held elsewhere) has lse -inf: weight 0
        mean_z = torch.where(w > 0, lse - entropy, torch.zeros_like(lse))
        parts = torch.stack([w, w * mean_z, target_z])
        dist.all_reduce(parts, op=dist.ReduceOp.SUM, group=self.group)
        total_lse = m + torch.log(parts[0])
        return total_lse, total_lse - parts[1] / parts[0], parts[2]

    def all_reduce_sum_(self, x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if x is not None:
            dist.all_reduce(x, op=dist.ReduceOp.SUM, group=self.group)
        return x


# ---- the two routes api.py takes for a head with a shard (mirroring ops.linear_logprobs / ops.one_pass_token_level)

def row_logprobs(backend: str, hidden: torch.Tensor, head: LMHead, targets: torch.Tensor, workspace_bytes: int,
                 kept_token_ids: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logps, entropy) [R] over the whole vocabulary (or each row's kept set: global ids [R, K]) of hidden rows
    [R, H], differentiable w.r.t. hidden and the local weight/bias shard of `head` (whose `shard` says where this
    rank's rows lie)."""
    return _ShardedLogprobs.apply(hidden.contiguous(), head.weight.contiguous(),
                                  None if head.bias is None else head.bias.contiguous(), targets,
                                  shard_backend(backend, head.shard, int(workspace_bytes), kept_token_ids), head)


def one_pass_token_level(backend: str, hidden: torch.Tensor, head: LMHead, targets: torch.Tensor,
                         inputs: TokenInputs, config, workspace_bytes: int, needs_hidden_grad: bool,
                         needs_weight_grad: bool):
    """`ops.one_pass_token_level` on a shard: (logps, entropy, terms, kl, clip, dhidden, dweight, dbias) of a
    token-level objective in one pass of `backend`, statistics combined per wave, dH all-reduced; empty tensors
    where not needed."""
    shard = head.shard
    token_grads, (terms, kl, clip) = token_step_per_wave(inputs.ready(), config, hidden.shape[0], hidden.device)
    local = head.local().with_tensors(head.weight.detach().contiguous(),
                                      None if head.bias is None else head.bias.detach().contiguous())
    one_pass = getattr(get_backend(backend).backend(shard.wave_workspace(workspace_bytes)), ONE_PASS.method)
    logps, entropy, _, grad_hidden, grad_weight, grad_bias = one_pass(
        hidden.detach().contiguous(), local, shard.local_targets(targets), token_grads, needs_hidden_grad,
        needs_weight_grad, combine_stats=shard.combine_stats)
    shard.all_reduce_sum_(grad_hidden)
    return (logps, entropy, terms, kl, clip, or_empty(grad_hidden, hidden), or_empty(grad_weight, hidden),
            or_empty(grad_bias, hidden))


class ShardBackend:
    """The Protocol on a vocabulary shard: `inner` (any backend) streams this rank's rows of the head, the
    statistics are combined over the group, and the backward runs `inner`'s with the whole vocabulary's statistics,
    then sums dH over the group. Targets are global ids; `head` is this rank's local head (no shard)."""

    def __init__(self, inner, shard: VocabShard, name: str = "shard"):
        self.inner, self.shard, self.name = inner, shard, name  # name: the wrapped backend's, for messages

    def linear_forward(self, hidden: torch.Tensor, head: LMHead, targets: torch.Tensor):
        local_targets = self.shard.local_targets(targets)
        logps, entropy, lse = self.inner.linear_forward(hidden, head, local_targets)
        # a backend returns lp = z_y - lse_local with z_y = 0 where the target is foreign: recover z_y
        target_z = torch.where(local_targets >= 0, logps + lse, torch.zeros_like(lse))
        lse, entropy, target_z = self.shard.combine_stats(lse, entropy, target_z)
        return target_z - lse, entropy, lse

    def linear_backward(self, grad_logps, grad_entropy, hidden: torch.Tensor, head: LMHead, targets: torch.Tensor,
                        lse, entropy, needs_hidden_grad: bool = True, needs_weight_grad: bool = True):
        grads = self.inner.linear_backward(grad_logps, grad_entropy, hidden, head, self.shard.local_targets(targets),
                                           lse, entropy, needs_hidden_grad=needs_hidden_grad,
                                           needs_weight_grad=needs_weight_grad)
        self.shard.all_reduce_sum_(grads[0] if needs_hidden_grad else None)
        return grads


def shard_backend(backend: str, shard: VocabShard, workspace_bytes: int,
                  kept_token_ids: Optional[torch.Tensor] = None) -> ShardBackend:
    """The registered backend `backend` on this rank's shard (its rows with a kept set scored over the set)."""
    inner = get_backend(backend).backend(shard.wave_workspace(workspace_bytes))
    if kept_token_ids is not None:
        # each kept id lives on one shard; a row is scored over its set even where no id of it is local
        inner = KeptTokenHead(inner, local_kept_ids(kept_token_ids, shard.offset, shard.sizes[shard.rank]),
                              has_set=rows_with_set(kept_token_ids),
                              chunk_elements=shard.wave_workspace(workspace_bytes) // 4)
    return ShardBackend(inner, shard, backend)


class _ShardedLogprobs(torch.autograd.Function):
    """Autograd over a ShardBackend (a plain autograd Function: the collectives run eagerly)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, backend: ShardBackend, head: LMHead):
        local = head.local().with_tensors(weight, bias)
        logps, entropy, lse = backend.linear_forward(hidden, local, targets)
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.backend, ctx.head = backend, head
        ctx.set_materialize_grads(False)
        return logps, entropy

    @staticmethod
    def backward(ctx, grad_logps, grad_entropy):
        refuse_second_order(ctx.backend.name)
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        grad_logps = torch.zeros_like(lse) if grad_logps is None else grad_logps.contiguous()
        grad_hidden, grad_weight, grad_bias = ctx.backend.linear_backward(
            grad_logps, None if grad_entropy is None else grad_entropy.contiguous(), hidden,
            ctx.head.local().with_tensors(weight, bias), targets, lse, entropy,
            needs_hidden_grad=needs_hidden, needs_weight_grad=needs_weight or needs_bias)
        return (grad_hidden if needs_hidden else None, grad_weight if needs_weight else None,
                grad_bias if needs_bias else None, None, None, None)
