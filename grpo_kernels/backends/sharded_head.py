"""Reading a vocabulary-sharded LM head from the caller's arguments, and refusing the ones that cannot be right.

Two forms: a DTensor weight (and bias) placed Shard(0) on a 1-D device mesh, as `ColwiseParallel` on `lm_head`
and transformers' tensor-parallel plans lay it out; or this rank's rows of the head as a plain tensor plus
`process_group=`. Either way each rank's vocabulary offset comes from one all-gather of the local sizes, so
shards may differ in size (V not divisible by the group size).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from . import AUTO, refuse_unsupported
from .vocab_parallel import VocabShard, is_dtensor


def _dtensor_local(name: str, x, mesh=None):
    """The local shard of a DTensor placed Shard(0) on a 1-D mesh (on `mesh` when given)."""
    from torch.distributed.tensor import Shard

    if x.device_mesh.ndim != 1:
        raise ValueError(f"{name} must be a DTensor on a 1-D device mesh (the tensor-parallel group), got a "
                         f"{x.device_mesh.ndim}-D mesh {x.device_mesh}")
    if mesh is not None and x.device_mesh != mesh:
        raise ValueError(f"{name} must be on the weight's device mesh {mesh}, got {x.device_mesh}")
    placement = x.placements[0]
    if not (isinstance(placement, Shard) and placement.dim == 0):
        raise ValueError(f"{name} must be sharded on dim 0 (the vocabulary), placements (Shard(dim=0),); got "
                         f"{tuple(x.placements)}. A replicated head is an ordinary head: pass {name}.to_local()")
    return x.to_local()  # differentiable: the shard's gradient flows back into the DTensor's


def _gather_layout(group, hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """[world, 4]: every rank's (vocabulary rows, hidden size, tokens, bias rows or -1)."""
    mine = torch.tensor([weight.shape[0], weight.shape[-1], hidden.numel() // max(1, hidden.shape[-1]),
                         -1 if bias is None else bias.shape[0]], dtype=torch.int64, device=hidden.device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, mine, group=group)
    return torch.stack(everyone).cpu()


def _check_layout(layout: torch.Tensor, global_rows: Optional[int], bias: bool) -> None:
    rows, hidden_sizes, tokens, bias_rows = layout.unbind(1)
    listed = rows.tolist()
    if min(listed) == 0:
        raise ValueError(f"weight: every rank of the group needs at least one vocabulary row; shard sizes {listed}")
    if global_rows is not None and sum(listed) != global_rows:
        raise ValueError(f"weight: the group's shard sizes {listed} sum to {sum(listed)}, but the DTensor weight "
                         f"has {global_rows} vocabulary rows")
    if len(set(hidden_sizes.tolist())) != 1:
        raise ValueError(f"weight: the ranks' shards disagree on the hidden size H: {hidden_sizes.tolist()}")
    if len(set(tokens.tolist())) != 1:
        raise ValueError(f"hidden: every rank of the group must pass the same tokens (the head's input is "
                         f"replicated over a tensor-parallel group); token counts per rank {tokens.tolist()}")
    if bias and bias_rows.tolist() != listed:
        raise ValueError(f"bias: each rank's bias shard must match its weight shard; bias rows {bias_rows.tolist()}, "
                         f"weight rows {listed}")
    if not bias and (bias_rows >= 0).any():
        raise ValueError("bias: some ranks of the group pass a bias and others do not")


def check_process_group(process_group: object) -> None:
    """None, or a torch.distributed ProcessGroup: refused otherwise when given (a module's constructor), before the
    group is first used."""
    if process_group is None:
        return
    if not dist.is_available():
        raise ValueError("process_group was given but this torch build has no torch.distributed")
    if not isinstance(process_group, dist.ProcessGroup):
        hint = " (a device mesh's group: mesh.get_group())" if type(process_group).__name__ == "DeviceMesh" else ""
        raise TypeError(f"process_group must be a torch.distributed ProcessGroup{hint}, got "
                        f"{type(process_group).__name__}")


def resolve_sharded_head(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                         process_group: Optional[object], backend: str
                         ) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[VocabShard]]:
    """(local weight, local bias, shard) for a sharded head; (weight, bias, None) for an ordinary one."""
    sharded = is_dtensor(weight)
    if is_dtensor(hidden):
        raise TypeError("hidden must be a plain tensor (the head's replicated input), got a DTensor; pass "
                        "hidden.to_local() (or hidden.full_tensor())")
    if is_dtensor(bias) and not sharded:
        raise TypeError("bias is a DTensor but weight is not: pass both as DTensors sharded on dim 0, or both as "
                        "local shards with process_group=")
    if not sharded and process_group is None:
        return weight, bias, None
    if backend != AUTO:
        refuse_unsupported(backend, sharded=True)
    if sharded:
        if process_group is not None:
            raise ValueError("process_group must be None with a DTensor weight: its device mesh is the group")
        if bias is not None and not is_dtensor(bias):
            raise TypeError("bias must be a DTensor sharded on dim 0 like the weight, got a plain tensor (mixed "
                            "DTensor/plain arguments)")
        global_rows, mesh = weight.shape[0], weight.device_mesh
        weight = _dtensor_local("weight", weight)
        bias = None if bias is None else _dtensor_local("bias", bias, mesh)
        group = mesh.get_group()
    else:
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("process_group was given but torch.distributed is not initialised")
        check_process_group(process_group)
        global_rows, group = None, process_group
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not isinstance(hidden, torch.Tensor):
        raise ValueError(f"weight must be this rank's [V_local, H] shard, got "
                         f"{list(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    layout = _gather_layout(group, hidden, weight, bias)
    _check_layout(layout, global_rows, bias is not None)
    shard = VocabShard(group=group, sizes=tuple(layout[:, 0].tolist()), rank=dist.get_rank(group))
    return weight, bias, shard
