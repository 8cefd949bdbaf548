"""One GRPO update on a fixed global batch; run alone or under `torchrun --nproc_per_node 2` (gloo, CPU).

Usage: python ddp_worker.py OUT.pt LOSS_TYPE[,LOSS_TYPE...] MICRO_BATCH_SIZE [MAX_TOKENS_PER_PACK | default:PAIR_COST]
With MAX_TOKENS_PER_PACK the micro-batches are packs of whole sequences (the padding-free step), else padded;
with default:PAIR_COST the default budget under a dense mask, packed or padded by cost (the route each process
would take alone and the one it took are saved).
Each process takes its contiguous share of the 16 completions; rank 0 saves, per loss type, the parameter
change of one SGD step (lr 1, so the change is minus the gradient) and the process-averaged loss.
"""

import sys
from typing import Optional

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from processes import leave_spawned_process
from rollout_batches import synthetic_batch

from grpo_engine.data.demo_task import build_char_tokenizer, build_tiny_model
from grpo_engine.model.loading import HiddenStatePolicy
from grpo_engine.steps.packing import (Pack, Packing, packed_cost, packed_lengths, padded_cost, plan_micro_batches,
                                  plan_packs, token_budget)
from grpo_engine.steps.update import UpdateInputs, num_items_per_process, policy_update
from grpo_kernels import GRPOLossConfig


def one_update(accelerator: Accelerator, loss_type: str, micro: int, packing: Optional[Packing]) -> dict:
    lm = build_tiny_model(build_char_tokenizer(), seed=0)
    policy = HiddenStatePolicy(lm).train()
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    policy, optimizer = accelerator.prepare(policy, optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)

    batch = synthetic_batch(lm.config.vocab_size, n=16, seed=5)  # the same global batch on every process
    advantages = torch.linspace(-2.0, 1.0, 16)
    n_local = 16 // accelerator.num_processes
    share = slice(accelerator.process_index * n_local, (accelerator.process_index + 1) * n_local)
    local = batch.select(share)
    num_items = num_items_per_process(accelerator, local.completion_mask)
    inputs = UpdateInputs(local, advantages[share], None, None, num_items)
    config = GRPOLossConfig(loss_type=loss_type, max_completion_length=7)
    metrics = policy_update(accelerator, policy, lm, optimizer, scheduler, inputs, config, micro, num_iterations=1,
                            max_grad_norm=0.0, backend="torch", step=1, packing=packing)
    loss = accelerator.reduce(torch.tensor([metrics["loss"]], dtype=torch.float64), reduction="mean")
    delta = {n: before[n] - p.detach() for n, p in accelerator.unwrap_model(policy).named_parameters()}
    routes = {}
    if packing is not None and packing.max_tokens is None:
        lengths = packed_lengths(local)
        alone = packed_cost(plan_packs(lengths, token_budget(lengths, packing, micro)), lengths, packing) < \
            padded_cost(local, micro, packing.pair_cost)
        taken = isinstance(plan_micro_batches(local, packing, micro)[0], Pack)
        routes = {"alone": gather_object([alone]), "taken": gather_object([taken])}
    return {"delta": delta, "loss": loss.item(), "num_items": inputs.num_items_in_batch, "packed": routes}


def main() -> None:
    out_path, loss_types, micro = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
    packing = None
    if len(sys.argv) > 4:
        budget = sys.argv[4]
        packing = Packing(None, False, float(budget.split(":")[1])) if budget.startswith("default:") \
            else Packing(max_tokens=int(budget))
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    results = {loss_type: one_update(accelerator, loss_type, micro, packing) for loss_type in loss_types}
    if accelerator.is_main_process:
        torch.save({"processes": accelerator.num_processes, "results": results}, out_path)
    accelerator.wait_for_everyone()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    leave_spawned_process()  # the results are saved: no interpreter teardown, where gloo's threads have aborted


if __name__ == "__main__":
    main()
