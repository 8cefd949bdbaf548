"""The update phase, padded against padding-free, on the same rollouts (`python -m engine.tools.packing_bench`).

A Qwen2 decoder built in code whose linear layers dominate (hidden 384, 4 layers, MLP 1024, vocabulary 2048;
random weights), a process's generation batch of 32 completions: prompts of 32-64 tokens, completion lengths
long-tailed (the 32 quantiles of a log-normal of median 100 tokens and sigma 1, capped at 512: two reach the
cap, so the padded micro-batches, every one as wide as the longest prompt + longest completion of the batch, hold
34% real tokens). One update phase is the trainer's: one optimizer step (AdamW) of `policy_update`, dapo with beta 0.04
(reference log-probs given), over micro-batches of 8 padded completions or over packs.

Every measurement is a fresh process (forked): it builds the model and batch, runs one untimed warm-up step, then
`--steps` timed ones. Step time: their median, as CPU time of the process (one thread: on an idle core that is
the wall time, and it does not count the time other jobs on a shared machine take the core) and as wall time.
Peak memory: the process's peak RSS (VmHWM) minus its RSS before the first step (weights and batch built), i.e.
what the step adds (AdamW state, gradients, activations). The modes run interleaved, `--rounds` times, so a
change in the machine's load falls on all of them; the report gives each mode's median over rounds and every
round's value.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import statistics
import sys
import time
from typing import Any, Optional, Sequence

import torch

HIDDEN, LAYERS, INTERMEDIATE, HEADS, KV_HEADS, VOCAB = 384, 4, 1024, 6, 2, 2048
N, MICRO = 32, 8
PROMPT = (32, 64)
MEDIAN, SIGMA, CAP = 100, 1.0, 512


def completion_lengths(n: int) -> torch.Tensor:
    """The log-normal's n quantiles at (i + 1/2) / n: the distribution itself, without sampling noise."""
    quantiles = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    normal = torch.distributions.Normal(0.0, 1.0).icdf(quantiles)
    return (MEDIAN * torch.exp(SIGMA * normal)).round().long().clamp(8, CAP)


def rollouts(seed: int):
    """The completion lengths and evenly spread prompt lengths, in a seeded random order, on random tokens."""
    from engine.rollout import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(N, generator=g)
    completion = completion_lengths(N)[order]
    prompt = torch.linspace(PROMPT[0], PROMPT[1], N).round().long()[torch.randperm(N, generator=g)]
    P, T = int(prompt.max()), int(completion.max())
    prompt_mask = (torch.arange(P)[None, :] >= P - prompt[:, None]).long()
    attention = (torch.arange(T)[None, :] < completion[:, None]).long()
    prompt_ids = torch.randint(0, VOCAB, (N, P), generator=g) * prompt_mask
    completion_ids = torch.randint(0, VOCAB, (N, T), generator=g) * attention
    return RolloutBatch([""] * N, [""] * N, prompt_ids, prompt_mask, completion_ids, attention, attention.clone(),
                        completion >= CAP)


def fill(batch) -> float:
    """Real tokens over the tokens of the padded micro-batches."""
    real = batch.prompt_mask.sum() + batch.completion_attention.sum()
    return float(real) / (batch.prompt_ids.numel() + batch.completion_ids.numel())


def _rss(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _measure(mode: str, max_tokens: Optional[int], steps: int, seed: int) -> dict[str, Any]:
    from accelerate import Accelerator
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from engine.model.loading import HiddenStatePolicy
    from engine.steps.packing import Packing, make_packs
    from engine.steps.update import UpdateInputs, policy_update
    from grpo_kernels import GRPOLossConfig

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         max_position_embeddings=1024, tie_word_embeddings=True)
    lm = Qwen2ForCausalLM(config)
    lm.config._attn_implementation = "sdpa"
    policy = HiddenStatePolicy(lm).train()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    batch = rollouts(seed)
    g = torch.Generator().manual_seed(seed + 2)
    ref = -torch.rand(batch.completion_ids.shape, generator=g) * batch.completion_attention
    advantages = torch.randn(N, generator=g)
    inputs = UpdateInputs(batch, advantages, None, ref, float(batch.completion_mask.sum()))
    packing = None if mode == "padded" else Packing(max_tokens)
    packs = [] if packing is None else make_packs(batch, packing, MICRO)
    loss_config = GRPOLossConfig(beta=0.04)  # TRL's default loss type
    accelerator = Accelerator(cpu=True)
    base = _rss("VmRSS:")
    times, cpu_times, losses = [], [], []
    for _ in range(steps + 1):
        start, cpu_start = time.perf_counter(), time.process_time()
        metrics = policy_update(accelerator, policy, lm, optimizer, scheduler, inputs, loss_config, MICRO, 1, 1.0,
                                "auto", step=0, packing=packing)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
        losses.append(metrics["loss"])
    return {"step_s": statistics.median(times[1:]), "cpu_s": statistics.median(cpu_times[1:]),
            "peak_mib": (_rss("VmHWM:") - base) / 2**20,
            "first_loss": losses[0], "micro_batches": len(packs) if packs else math.ceil(N / MICRO),
            "largest_pack": max((p.num_tokens for p in packs), default=None)}


def measure(mode: str, max_tokens: Optional[int], steps: int, seed: int) -> dict[str, Any]:
    with multiprocessing.get_context("fork").Pool(1, maxtasksperchild=1) as pool:
        return pool.apply(_measure, (mode, max_tokens, steps, seed))


def run(budgets: Sequence[Optional[int]], rounds: int, steps: int, seed: int) -> dict[str, Any]:
    modes = [("padded", None)] + [("packed", b) for b in budgets]
    results: dict[str, list[dict[str, Any]]] = {label(m, b): [] for m, b in modes}
    for _ in range(rounds):
        for mode, budget in modes:
            results[label(mode, budget)].append(measure(mode, budget, steps, seed))
    return results


def label(mode: str, budget: Optional[int]) -> str:
    return "padded" if mode == "padded" else f"packed {budget if budget is not None else 'default'}"


def report(results: dict[str, list[dict[str, Any]]], command: str, seed: int) -> str:
    batch = rollouts(seed)
    lengths = batch.completion_attention.sum(1)
    longest = int((batch.prompt_mask.sum(1) + lengths).max())
    padded = statistics.median(r["cpu_s"] for r in results["padded"])
    padded_wall = statistics.median(r["step_s"] for r in results["padded"])
    padded_peak = statistics.median(r["peak_mib"] for r in results["padded"])
    lines = [
        f"Command: `{command}`", "",
        f"Model: Qwen2, hidden {HIDDEN}, {LAYERS} layers, MLP {INTERMEDIATE}, {HEADS} heads ({KV_HEADS} KV), "
        f"vocabulary {VOCAB}, float32, sdpa, 1 thread. Batch: {N} completions, padded micro-batches of {MICRO}; "
        f"prompts {PROMPT[0]}-{PROMPT[1]} tokens; completion lengths: the {N} quantiles of a log-normal (median "
        f"{MEDIAN}, sigma {SIGMA}) capped at {CAP}: min {int(lengths.min())}, "
        f"median {float(lengths.float().median()):.0f}, mean {float(lengths.float().mean()):.0f}, "
        f"max {int(lengths.max())}; longest sequence {longest} tokens. "
        f"Padded micro-batches: {batch.prompt_ids.shape[1] + batch.completion_ids.shape[1]} tokens wide, "
        f"{fill(batch):.1%} real tokens.", "",
        "| mode | budget (tokens) | micro-batches | largest pack | CPU s per step | speed-up (CPU) | wall s | "
        "speed-up (wall) | peak MiB above start | peak vs padded | loss of step 1 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, rows in results.items():
        cpu = statistics.median(r["cpu_s"] for r in rows)
        wall = statistics.median(r["step_s"] for r in rows)
        peak = statistics.median(r["peak_mib"] for r in rows)
        budget = "-" if name == "padded" else name.split()[1]
        largest = rows[0]["largest_pack"] if rows[0]["largest_pack"] is not None else "-"
        lines.append(f"| {name.split()[0]} | {budget} | {rows[0]['micro_batches']} | {largest} | {cpu:.2f} | "
                     f"{padded / cpu:.2f}x | {wall:.2f} | {padded_wall / wall:.2f}x | {peak:.0f} | "
                     f"{peak / padded_peak:.2f} | {rows[0]['first_loss']:.6f} |")
    lines += ["", "Every round (CPU s / wall s / peak MiB):", ""]
    for name, rows in results.items():
        lines.append(f"- {name}: " + "; ".join(f"{r['cpu_s']:.2f} / {r['step_s']:.2f} / {r['peak_mib']:.0f}"
                                               for r in rows))
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=int, nargs="*", default=[576, 1024, 2048, 4576],
                        help="packed budgets to measure (tokens per pack); the default budget is always measured")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every mode")
    parser.add_argument("--steps", type=int, default=1, help="timed steps per measurement (after one warm-up)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("rounds", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if any(b < 1 for b in args.budgets):
        parser.error(f"--budgets must be >= 1, got {args.budgets}")
    results = run([*args.budgets, None], args.rounds, args.steps, args.seed)
    print(report(results, "python -m engine.tools.packing_bench " + " ".join(argv or sys.argv[1:]), args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
