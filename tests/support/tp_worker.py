"""One rank of a 2-process gloo group: the built-in tiny model loaded with transformers' tensor-parallel plan
gives, through grpo_engine.model.loading.with_lm_head and the vocabulary-parallel kernels, the loss and LM-head gradient of
the same model loaded whole. Used by test_models_tensor_parallel.py."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM
from transformers.distributed import DistributedConfig

from grpo_engine.model.loading import HiddenStatePolicy, with_lm_head
from grpo_engine.model.tensor_parallel import is_tensor_parallel
from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss
from grpo_kernels.integrations.sharding import is_vocab_parallel_head
from processes import leave_spawned_process


def loss_and_head_grad(model, batch: dict):
    hidden = HiddenStatePolicy(model)(batch["input_ids"], batch["attention_mask"])[:, :-1]
    config = GRPOLossConfig(loss_type="grpo", beta=0.0, entropy_coef=0.01)
    out = with_lm_head(model, hidden, lambda h, weight, head: fused_linear_grpo_loss(
        h, weight, batch["input_ids"][:, 1:], batch["attention_mask"][:, 1:], batch["advantages"], **head,
        config=config))
    out.loss.backward()
    grad = model.get_output_embeddings().weight.grad
    return out.loss.detach(), out.logps, grad


def main(model_dir: str, init_file: str, rank: int, world: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        gen = torch.Generator().manual_seed(0)
        whole = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        V = whole.get_output_embeddings().weight.shape[0]
        batch = dict(input_ids=torch.randint(0, V, (3, 7), generator=gen),
                     attention_mask=torch.ones(3, 7, dtype=torch.long), advantages=torch.randn(3, generator=gen))
        batch["attention_mask"][0, :2] = 0  # left padding, as rollouts have
        sharded = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, distributed_config=DistributedConfig(tp_plan="auto", tp_size=world))
        head = sharded.get_output_embeddings()
        assert is_tensor_parallel(sharded)
        placements = getattr(head.weight, "placements", None)
        assert is_vocab_parallel_head(head, tensor_parallel_model=True), f"not a vocabulary-parallel head: {placements}"
        loss, logps, grad = loss_and_head_grad(sharded, batch)
        ref_loss, ref_logps, ref_grad = loss_and_head_grad(whole, batch)
        torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logps, ref_logps, atol=1e-5, rtol=1e-5)
        local = grad.to_local()
        sizes: list = [None] * world
        dist.all_gather_object(sizes, local.shape[0])
        start = sum(sizes[:rank])
        assert sum(sizes) == V and local.shape[0] < V
        torch.testing.assert_close(local, ref_grad[start:start + local.shape[0]], atol=1e-5, rtol=1e-4)
    finally:
        dist.destroy_process_group()
    leave_spawned_process()  # checks done, group destroyed: no interpreter teardown, where gloo's threads have aborted


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
