"""The whole LM-head weight for a kernel that reads it directly, under DeepSpeed ZeRO-3 and FSDP2.

The fused kernels never call `lm_head(...)`; they read `lm_head.weight`. Sharding engines only materialise a
parameter around its module's own forward, so:

* FSDP2 (`fully_shard`) leaves the head a DTensor once its module is resharded: it is all-gathered
  differentiably, and its gradient is averaged over the mesh while it is reduce-scattered back onto the shard,
  as FSDP2 averages every other gradient over its data-parallel processes. (`full_tensor()` alone would hand
  each rank only its own slice of its own data's gradient: its backward takes the gradient as replicated.)
* DeepSpeed ZeRO-3 leaves a partitioned parameter of numel 0: `deepspeed.zero.GatheredParameters` gathers it
  for the forward. The kernels' backward recomputes the logits from the weight, so the gather is entered
  again when the backward reaches the kernel, and left once the backward has passed it.
* FSDP1 unshards the head only inside the wrapped model's forward, which is where the patched forward runs.

Whatever the engine, the weight is checked against the module's [V, H] before use: a shard is never used.
"""

from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager
from typing import Any, Callable, Iterable, Optional

import torch
from torch import nn

from .lm_head import check_full_weight

GatherFactory = Callable[[list[torch.Tensor]], Optional[AbstractContextManager]]


def zero3_gather_context(params: list[torch.Tensor]) -> Optional[AbstractContextManager]:
    """`GatheredParameters` over the ZeRO-3-partitioned params, or None when none is partitioned."""
    try:
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
    except ImportError:  # pragma: no cover - transformers is a dependency
        return None
    if not is_deepspeed_zero3_enabled():
        return None
    import deepspeed
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    # A tied head is already AVAILABLE inside the embedding's forward; gathering it again (or listing one
    # parameter twice) breaks ZeRO-3's bookkeeping.
    partitioned = {id(p): p for p in params
                   if p is not None and getattr(p, "ds_status", ZeroParamStatus.AVAILABLE) != ZeroParamStatus.AVAILABLE}
    if not partitioned:
        return None
    return deepspeed.zero.GatheredParameters(list(partitioned.values()))


def _full(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The whole tensor of a DTensor shard; its gradient is the average of every rank's (data-parallel: each
    rank's loss is over its own data), reduce-scattered onto the shard."""
    # Imported lazily: DTensor lives in torch.distributed, which some builds lack.
    if x is None:
        return None
    try:
        from torch.distributed.tensor import DTensor, Partial, Replicate
    except ImportError:  # pragma: no cover
        return x
    if not isinstance(x, DTensor):
        return x
    dims = x.device_mesh.ndim
    return x.redistribute(placements=[Replicate()] * dims).to_local(grad_placements=[Partial("avg")] * dims)


class _BackwardGather:
    """Re-enters the gather when the backward reaches the kernel's outputs, leaves it after the kernel."""

    def __init__(self, factory: GatherFactory, params: list[torch.Tensor]) -> None:
        self.factory, self.params = factory, params
        self.context: Optional[AbstractContextManager] = None

    def enter(self, grad: torch.Tensor) -> None:
        if self.context is None:
            context = self.factory(self.params)
            if context is not None:
                context.__enter__()
                self.context = context

    def exit(self) -> None:
        if self.context is not None:
            context, self.context = self.context, None
            context.__exit__(None, None, None)


class _LeaveGatherOnBackward(torch.autograd.Function):
    """Identity on the hidden states; its backward runs right after the kernel's, so the gather ends there."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, gather: _BackwardGather) -> torch.Tensor:  # type: ignore[override]
        ctx.gather = gather
        return hidden.view_as(hidden)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        ctx.gather.exit()
        return grad, None


def _tensors_with_grad(result: Any) -> Iterable[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        if result.requires_grad:
            yield result
    elif isinstance(result, (tuple, list)):
        for item in result:
            yield from _tensors_with_grad(item)
    elif dataclasses.is_dataclass(result):
        for field in dataclasses.fields(result):
            yield from _tensors_with_grad(getattr(result, field.name))


def is_vocab_parallel_head(head: nn.Module, tensor_parallel_model: bool = False) -> bool:
    """A tensor-parallel LM head: its weight a DTensor placed Shard(0) on a 1-D tensor-parallel mesh. The mesh
    is known to be one when it is named "tp" (`ColwiseParallel` on a ("tp",) mesh, transformers 5.23's plans)
    or when the caller knows the model is tensor-parallel (`tensor_parallel_model`: transformers 5.17's
    `tp_plan="auto"` names no mesh dimension). The fused kernels take such a head as it is
    (vocabulary-parallel, grpo_kernels.backends.vocab_parallel); an FSDP2 shard (a data-parallel mesh, unnamed by
    default) is gathered instead (`call_with_full_head`)."""
    try:
        from torch.distributed.tensor import DTensor, Shard
    except ImportError:  # pragma: no cover
        return False
    weight = head.weight
    if not isinstance(weight, DTensor) or tuple(weight.placements) != (Shard(0),) or weight.device_mesh.ndim != 1:
        return False
    return tensor_parallel_model or weight.device_mesh.mesh_dim_names == ("tp",)


def call_with_full_head(fn: Callable[[torch.Tensor, torch.Tensor, Optional[torch.Tensor]], Any],
                        hidden: torch.Tensor, head: nn.Module,
                        gather_factory: GatherFactory = zero3_gather_context) -> Any:
    """`fn(hidden, weight, bias)` with the whole LM-head weight and bias, gathered the engine's way.

    `gather_factory(params)` returns a context that materialises partitioned params (ZeRO-3's
    `GatheredParameters`) or None; it is a parameter so the logic can be tested without DeepSpeed.
    """
    params = [p for p in (head.weight, head.bias) if p is not None]
    weight, bias = _full(head.weight), _full(head.bias)
    context = gather_factory(params)
    if context is None:
        check_full_weight(head, weight, bias, hidden.shape[-1])
        return fn(hidden, weight, bias)

    backward_gather = _BackwardGather(gather_factory, params)
    with context:
        check_full_weight(head, weight, bias, hidden.shape[-1])
        needs_backward = torch.is_grad_enabled() and any(p.requires_grad for p in params)
        if needs_backward and not hidden.requires_grad:
            # The gather must end after the kernel's backward; routing a gradient through the hidden states
            # (to nowhere) guarantees a node that runs right then.
            hidden = hidden.detach().requires_grad_()
        if torch.is_grad_enabled() and hidden.requires_grad:
            hidden = _LeaveGatherOnBackward.apply(hidden, backward_gather)
        result = fn(hidden, weight, bias)
    for tensor in _tensors_with_grad(result):
        tensor.register_hook(backward_gather.enter)
    return result
