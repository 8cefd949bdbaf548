"""One rank of a 2-process gloo group: an LM head sharded by FSDP2 (`fully_shard`), read by the fused loss through
`call_with_full_head` while it is a DTensor shard, each rank on its own data. Its sharded gradient must be the
average over the ranks of the float64 reference gradients on the whole head, as FSDP2 averages every other
gradient, and each rank's hidden-state gradient its own data's. Used by test_integration_sharding.py through
torch.multiprocessing; an assertion in any rank fails the test."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from grpo_testing import as_float64, assert_grad_close, assert_loss_close, make_problem, run_loss
from processes import leave_spawned_process
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss
from grpo_kernels.integrations.sharding import call_with_full_head

CONFIG = GRPOLossConfig(loss_type="grpo", beta=0.04, entropy_coef=0.01)


def rank_problem(rank: int):
    """The shared head (seed 0) with this rank's own hidden states, completions, advantages and log-probs."""
    head, data = make_problem(seed=0), make_problem(seed=1 + rank)
    data.weight, data.bias = head.weight, head.bias
    return data


def run(rank: int, world: int, init_file: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        problem = rank_problem(rank)
        head = nn.Linear(problem.weight.shape[1], problem.weight.shape[0])
        with torch.no_grad():
            head.weight.copy_(problem.weight)
            head.bias.copy_(problem.bias)
        fully_shard(head, mesh=init_device_mesh("cpu", (world,), mesh_dim_names=("dp",)))
        assert isinstance(head.weight, DTensor)  # a shard at rest: the kernels must gather it
        hidden = problem.hidden.clone().requires_grad_()
        kwargs = problem.loss_kwargs()
        del kwargs["bias"]
        out = call_with_full_head(lambda h, weight, bias: fused_linear_grpo_loss(
            h, weight, problem.completion_ids, problem.completion_mask, problem.advantages, bias=bias,
            config=CONFIG, backend="torch", **kwargs), hidden, head)
        out.loss.backward()

        references = [run_loss(fused_linear_grpo_loss, as_float64(rank_problem(r)), CONFIG, backend="reference")
                      for r in range(world)]
        own_out, own_grads = references[rank]
        assert_loss_close(out.loss, own_out.loss, torch.float32)
        assert_grad_close(hidden.grad, own_grads["hidden"], torch.float32, "dhidden (this rank's data)")
        for name in ("weight", "bias"):
            grad = getattr(head, name).grad
            assert isinstance(grad, DTensor), f"d{name} is not on the shard"
            average = sum(grads[name] for _, grads in references) / world
            assert_grad_close(grad.full_tensor(), average, torch.float32, f"d{name} (average over the ranks)")
    finally:
        dist.destroy_process_group()
    leave_spawned_process()
