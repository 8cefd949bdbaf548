"""Two AdamW steps of the GRPO update (dapo with KL, 2 micro-batches a step, the second step's ratios against
old log-probs, gradient clipping active) on a fixed global batch of 16 completions; run alone (one process, the
whole model) or under `torchrun --nproc_per_node 2` with the model sharded by FSDP2 (grpo_engine.model.fsdp), gloo on CPU.

Usage: python fsdp_worker.py OUT.pt [MAX_TOKENS_PER_PACK]
With MAX_TOKENS_PER_PACK the micro-batches (log-probs and update) are packs of whole sequences, else padded.
The main process saves the old and reference log-probs of every completion, the update's metrics averaged over
processes, the whole (clipped) gradient of every parameter at each optimizer step, and the whole model's weights
and AdamW state after the update (gathered from the shards).
"""

import sys

import torch
from accelerate import Accelerator
from processes import leave_spawned_process
from rollout_batches import synthetic_batch
from torch.distributed.tensor import DTensor
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from grpo_engine.data.demo_task import build_char_tokenizer, build_tiny_model
from grpo_engine.model.fsdp import data_parallel_mesh, full_state_dict, shard_policy
from grpo_engine.model.loading import HiddenStatePolicy, frozen_copy
from grpo_engine.steps.logprobs import reference_logprobs, sequence_logprobs
from grpo_engine.steps.packing import Packing
from grpo_engine.steps.update import UpdateInputs, num_items_per_process, policy_update
from grpo_kernels import GRPOLossConfig

N, MICRO = 16, 4


def main() -> None:
    out_path = sys.argv[1]
    packing = Packing(max_tokens=int(sys.argv[2])) if len(sys.argv) > 2 else None
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    processes = accelerator.num_processes
    lm = build_tiny_model(build_char_tokenizer(), seed=0)
    policy, reference = HiddenStatePolicy(lm).train(), HiddenStatePolicy(frozen_copy(lm))
    if processes > 1:
        mesh = data_parallel_mesh(accelerator.device)
        policy, reference = shard_policy(policy, mesh), shard_policy(reference, mesh)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    gradients = []  # per optimizer step: {name: whole gradient}, gathered on every process in the same order
    optimizer.register_step_pre_hook(lambda *_: gradients.append({
        name: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad.clone()
        for name, p in lm.named_parameters()}))

    batch = synthetic_batch(lm.config.vocab_size, n=N, seed=5)  # the same global batch on every process
    advantages = torch.linspace(-2.0, 1.0, N)
    share = slice(accelerator.process_index * N // processes, (accelerator.process_index + 1) * N // processes)
    local = batch.select(share)
    old = sequence_logprobs(policy, local, 1.0, MICRO, "torch", packing=packing)
    ref = reference_logprobs(policy, reference, local, 1.0, MICRO, "torch", packing=packing)
    inputs = UpdateInputs(local, advantages[share], old, ref, num_items_per_process(accelerator, local.completion_mask))
    metrics = policy_update(accelerator, policy, lm, optimizer, scheduler, inputs, GRPOLossConfig(beta=0.04), MICRO,
                            num_iterations=2, max_grad_norm=0.05, backend="torch", step=1, packing=packing)
    names = sorted(metrics)
    averaged = accelerator.reduce(torch.tensor([metrics[n] for n in names], dtype=torch.float64), reduction="mean")
    weights = full_state_dict(lm) if processes > 1 else lm.state_dict()
    optimizer_state = get_optimizer_state_dict(lm, optimizer, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))
    old_all, ref_all = accelerator.gather(old), accelerator.gather(ref)
    if accelerator.is_main_process:
        torch.save({"processes": processes, "metrics": dict(zip(names, averaged.tolist())), "old": old_all,
                    "ref": ref_all, "gradients": gradients, "weights": weights, "optimizer": optimizer_state["state"]}, out_path)
    accelerator.wait_for_everyone()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    leave_spawned_process()  # the results are saved: no interpreter teardown, where gloo's threads have aborted


if __name__ == "__main__":
    main()
