"""A tensor-parallel group for the vocabulary-parallel benchmark: the pytest process is rank 0 (it times the
step with pytest-benchmark), helper processes are the other ranks and run the same step whenever rank 0 does.

Rank 0 broadcasts each command: ("case", shape, regime, case name, backend) to build a case's inputs and
step, ("step",) to run it once, ("stop",) to leave. gloo on CPU, NCCL with one GPU per rank on CUDA: the
same code on both.
"""

from __future__ import annotations

import os
import tempfile
from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import grpo_kernels

from .cases import LOSS_CASES
from .inputs import make_inputs
from .shapes import BenchShape

TP_WORLD = 2
Step = Callable[[], object]


def group_device(rank: int, device_type: str) -> torch.device:
    return torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")


def make_step(shape: BenchShape, regime: str, case_name: str, backend: str, device: torch.device,
              sharded: bool) -> Step:
    """Loss forward + backward; sharded: this rank's rows of the head (torch.tensor_split of V, uneven when V
    is not divisible) with the world group, returning the gradients of hidden and the local shard."""
    inputs = make_inputs(shape, regime, device)
    case = LOSS_CASES[case_name]
    weight, group = inputs.weight, None
    if sharded:
        group = dist.group.WORLD
        rows = torch.tensor_split(torch.arange(shape.head.vocab), dist.get_world_size())[dist.get_rank()]
        weight = inputs.weight.detach()[int(rows[0]):int(rows[-1]) + 1].clone().requires_grad_()
    kwargs = dict(old_logps=inputs.old_logps if case.uses_old_logps else None,
                  ref_logps=inputs.ref_logps if case.uses_ref_logps else None)

    def step():
        out = grpo_kernels.fused_linear_grpo_loss(
            inputs.hidden, weight, inputs.completion_ids, inputs.completion_mask, inputs.advantages,
            config=case.config, backend=backend, process_group=group, **kwargs)
        return torch.autograd.grad(out.loss, (inputs.hidden, weight))
    return step


def _broadcast(message: Optional[tuple], device: torch.device) -> tuple:
    box = [message]
    dist.broadcast_object_list(box, src=0, device=device)
    return box[0]


def _init(rank: int, world: int, init_file: str, device_type: str) -> torch.device:
    device = group_device(rank, device_type)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"file://{init_file}",
                            rank=rank, world_size=world)
    return device


def _follow(index: int, world: int, init_file: str, device_type: str, threads: int) -> None:
    """Helper number `index` (rank index + 1): build and run what rank 0 says until it says stop."""
    torch.set_num_threads(threads)
    device = _init(index + 1, world, init_file, device_type)
    step = None
    try:
        while True:
            message = _broadcast(None, device)
            if message[0] == "stop":
                break
            if message[0] == "case":
                step = make_step(*message[1:], device=device, sharded=True)
            else:
                step()
    finally:
        dist.destroy_process_group()
    # Stopped cleanly and the group is gone: exit without the interpreter's teardown, in which gloo's threads have
    # aborted a process ("terminate called without an active exception"), failing a spawn whose work all succeeded.
    os._exit(0)


class ShardGroup:
    """Rank 0 of a TP_WORLD-rank group (this process) and its helper processes."""

    def __init__(self, device_type: str, world: int = TP_WORLD):
        self.world = world
        self._dir = tempfile.TemporaryDirectory(prefix="grpo-tp-")
        init_file = os.path.join(self._dir.name, "init")
        self._helpers = mp.start_processes(_follow, args=(world, init_file, device_type, torch.get_num_threads()),
                                           nprocs=world - 1, join=False, start_method="spawn")
        self.device = _init(0, world, init_file, device_type)

    def sharded_step(self, shape: BenchShape, regime: str, case_name: str, backend: str) -> Step:
        _broadcast(("case", shape, regime, case_name, backend), self.device)
        local = make_step(shape, regime, case_name, backend, self.device, sharded=True)

        def step():
            _broadcast(("step",), self.device)
            return local()
        return step

    def close(self) -> None:
        _broadcast(("stop",), self.device)
        dist.destroy_process_group()
        while not self._helpers.join():
            pass
        self._dir.cleanup()
