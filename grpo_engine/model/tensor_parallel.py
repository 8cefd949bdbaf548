"""Pure tensor parallelism (`model.tensor_parallel` N > 1, N = the number of processes).

Every process is one rank of a single tensor-parallel group: transformers' `tp_plan="auto"` shards the model
over the N processes, whose outputs (logits, hidden states) are then replicated. So there is one data-parallel
replica: every rank draws the same prompts, generates the same whole batch from the same sampling seed and
computes the same rewards, advantages and loss, while the fused loss takes the vocabulary-sharded LM head as
it is. `SingleReplicaAccelerator` lets the trainer's data-parallel code (gathers, averages, shares of the
batch) see that one replica without a branch of its own.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import ContextManager, Iterable

import torch
from accelerate import Accelerator
from torch import nn
from torch.distributed.tensor import DTensor

from ..config import ConfigError, EngineConfig


def check_tensor_parallel(config: EngineConfig, num_processes: int) -> None:
    """N == 1, or N == the number of processes (its combination with LoRA is the schema's rule)."""
    n = config.model.tensor_parallel
    if n != 1 and n != num_processes:
        raise ConfigError(
            f"model.tensor_parallel is {n} but the run has {num_processes} process(es): only pure tensor "
            f"parallelism is supported, every process one rank of the group (launch exactly {n} processes, e.g. "
            f"`torchrun --nproc_per_node {n}`); data parallelism combined with tensor parallelism is not")


def is_tensor_parallel(model: nn.Module) -> bool:
    """A transformers model loaded with a tensor-parallel plan over more than one process."""
    return (getattr(model, "tp_size", None) or 1) > 1


@torch.no_grad()
def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """torch's clip_grad_norm_ for a model whose parameters mix DTensor shards and plain (replicated) tensors,
    which torch's own refuses: each DTensor's norm is taken over its whole (global) tensor, a plain one's once."""
    grads = [p.grad for p in parameters if p.grad is not None]
    squares = []
    for grad in grads:
        norm = torch.linalg.vector_norm(grad, dtype=torch.float32)
        squares.append((norm.full_tensor() if isinstance(norm, DTensor) else norm).square())
    total = torch.stack(squares).sum().sqrt() if squares else torch.zeros(())
    scale = min(1.0, max_norm / (total.item() + 1e-6))
    if scale < 1.0:
        for grad in grads:
            grad.mul_(scale)
    return total


class SingleReplicaAccelerator:
    """The accelerator as the trainer's data-parallel code sees it under pure tensor parallelism: one replica,
    so gathers and reductions are identities and the batch is not split; the main process, barriers and
    device are the real ones (`world`)."""

    num_processes = 1
    process_index = 0

    def __init__(self, world: Accelerator) -> None:
        self.world = world

    @property
    def device(self) -> torch.device:
        return self.world.device

    @property
    def is_main_process(self) -> bool:
        return self.world.is_main_process

    @property
    def distributed_type(self):
        return self.world.distributed_type

    def wait_for_everyone(self) -> None:
        self.world.wait_for_everyone()

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def reduce(self, tensor: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        return tensor

    def no_sync(self, model: nn.Module) -> ContextManager[None]:
        return nullcontext()  # no DDP wrapper: nothing to synchronise

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def unwrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def clip_grad_norm_(self, parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
        return clip_grad_norm(parameters, max_norm)
