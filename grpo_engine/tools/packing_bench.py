"""The update phase, padded against padding-free, at several completion-length spreads
(`python -m grpo_engine.tools.packing_bench`).

A Qwen2 decoder built in code whose linear layers dominate (hidden 384, 4 layers, MLP 1024, vocabulary 2048;
random weights), a process's generation batch of 32 completions with prompts of 32-64 tokens and completion
lengths from one of SPREADS: all 128 tokens, evenly 96-128 or 32-256, or long-tailed (the 32 quantiles of a
log-normal, capped at 512). The padded micro-batches, every row as wide as the longest prompt + the longest
completion of the batch, hold from 92% real tokens (uniform) down to a quarter (long tails). One update phase is
the trainer's: one optimizer step (AdamW) of `policy_update`, dapo with beta 0.04 (reference log-probs given),
over micro-batches of 8 padded completions or over packs.

Modes: `padded` (optim.padding_free false); `packed-dense` (packs of the budget the default had before the
per-sequence attention: twice the longest sequence, at least 1024 tokens, under sdpa's dense block-diagonal
mask); `packed-per-sequence` (packs of a padded micro-batch's tokens, sdpa run per sequence:
grpo_engine.model.packed_attention); `default` (what `optim.padding_free: true` runs: per-sequence sdpa, and each
batch packed or padded by estimated cost).

For each spread one process builds the model and batch, runs every mode once untimed (warm-up), then
`--rounds` rounds of every mode in turn, one step each: a change in the machine's load falls on all modes
alike. The learning rate is 0, so every step sees the same weights and the modes' losses compare. Step time:
the median over rounds of the process's CPU time (one thread: on an idle core that is the wall time, and it does
not count the time other jobs on a shared machine take the core), and of the wall time.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Callable, Optional, Sequence

import torch

from ..cli_parser import CommandParser, doc_summary
from ..cli_types import bounded_int, positive_int
from ..command_failure import run_tool
from ..config.schema import MAX_SEED

HIDDEN, LAYERS, INTERMEDIATE, HEADS, KV_HEADS, VOCAB = 384, 4, 1024, 6, 2, 2048
N, MICRO = 32, 8
PROMPT = (32, 64)
MODES = ("padded", "packed-dense", "packed-per-sequence", "default")


def log_normal_quantiles(n: int, median: float, sigma: float, cap: int) -> torch.Tensor:
    """The log-normal's n quantiles at (i + 1/2) / n: the distribution itself, without sampling noise."""
    quantiles = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    normal = torch.distributions.Normal(0.0, 1.0).icdf(quantiles)
    return (median * torch.exp(sigma * normal)).round().long().clamp(8, cap)


def evenly(low: int, high: int) -> Callable[[int], torch.Tensor]:
    return lambda n: torch.linspace(low, high, n).round().long()


SPREADS: dict[str, tuple[str, Callable[[int], torch.Tensor]]] = {
    "uniform-128": ("every completion 128 tokens", lambda n: torch.full((n,), 128)),
    "96-128": ("evenly spread over 96-128 tokens", evenly(96, 128)),
    "32-256": ("evenly spread over 32-256 tokens", evenly(32, 256)),
    "long-tail": ("log-normal quantiles, median 100, sigma 1, capped at 512",
                  lambda n: log_normal_quantiles(n, 100, 1.0, 512)),
    "long-tail-short": ("log-normal quantiles, median 50, sigma 1, capped at 512",
                        lambda n: log_normal_quantiles(n, 50, 1.0, 512)),
}


def rollouts(spread: str, seed: int):
    """The spread's completion lengths and evenly spread prompt lengths, in a seeded random order, on random
    tokens."""
    from grpo_engine.rollout import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(N, generator=g)
    completion = SPREADS[spread][1](N)[order]
    prompt = torch.linspace(PROMPT[0], PROMPT[1], N).round().long()[torch.randperm(N, generator=g)]
    P, T = int(prompt.max()), int(completion.max())
    prompt_mask = (torch.arange(P)[None, :] >= P - prompt[:, None]).long()
    attention = (torch.arange(T)[None, :] < completion[:, None]).long()
    prompt_ids = torch.randint(0, VOCAB, (N, P), generator=g) * prompt_mask
    completion_ids = torch.randint(0, VOCAB, (N, T), generator=g) * attention
    return RolloutBatch([""] * N, [""] * N, prompt_ids, prompt_mask, completion_ids, attention, attention.clone(),
                        completion >= T)


def fill(batch) -> float:
    """Real tokens over the tokens of the padded micro-batches."""
    real = batch.prompt_mask.sum() + batch.completion_attention.sum()
    return float(real) / (batch.prompt_ids.numel() + batch.completion_ids.numel())


def measure_spread(spread: str, rounds: int, seed: int) -> dict[str, Any]:
    """Every mode's step times (CPU s, wall s) over the rounds, its micro-batches and its first loss."""
    from accelerate import Accelerator
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_engine.model.loading import HiddenStatePolicy
    from grpo_engine.model.packed_attention import PER_SEQUENCE_SDPA
    from grpo_engine.steps.packing import (Pack, Packing, attention_pair_cost, packed_lengths, plan_micro_batches,
                                      token_budget)
    from grpo_engine.steps.update import UpdateInputs, policy_update
    from grpo_kernels import GRPOLossConfig

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         max_position_embeddings=1024, tie_word_embeddings=True)
    lm = Qwen2ForCausalLM(config)
    policy = HiddenStatePolicy(lm).train()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=0.0)  # every mode's step sees the same weights
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    batch = rollouts(spread, seed)
    g = torch.Generator().manual_seed(seed + 2)
    ref = -torch.rand(batch.completion_ids.shape, generator=g) * batch.completion_attention
    advantages = torch.randn(N, generator=g)
    inputs = UpdateInputs(batch, advantages, None, ref, float(batch.completion_mask.sum()))
    pair_cost = attention_pair_cost(config)
    lengths = packed_lengths(batch)
    dense_budget = token_budget(lengths, Packing(), MICRO)  # the dense-mask budget, resolved for this batch
    setups: dict[str, tuple[str, Optional[Packing]]] = {
        "padded": ("sdpa", None),
        "packed-dense": ("sdpa", Packing(dense_budget, False, pair_cost)),
        "packed-per-sequence": (PER_SEQUENCE_SDPA, Packing(MICRO * max(lengths), True, pair_cost)),
        "default": (PER_SEQUENCE_SDPA, Packing(None, True, pair_cost)),
    }
    loss_config = GRPOLossConfig(beta=0.04)  # TRL's default loss type
    accelerator = Accelerator(cpu=True)
    results: dict[str, Any] = {mode: {"cpu_s": [], "step_s": []} for mode in MODES}
    for timed in [False] + [True] * rounds:
        for mode in MODES:
            attention, packing = setups[mode]
            lm.config._attn_implementation = attention
            start, cpu_start = time.perf_counter(), time.process_time()
            metrics = policy_update(accelerator, policy, lm, optimizer, scheduler, inputs, loss_config, MICRO, 1,
                                    1.0, "auto", step=0, packing=packing)
            cpu, wall = time.process_time() - cpu_start, time.perf_counter() - start
            if timed:
                results[mode]["cpu_s"].append(cpu)
                results[mode]["step_s"].append(wall)
            else:
                parts = plan_micro_batches(batch, packing, MICRO)
                packs = [p for p in parts if isinstance(p, Pack)]
                results[mode].update(first_loss=metrics["loss"], micro_batches=len(parts),
                                     route="packed" if packs else "padded",
                                     largest_pack=max((p.num_tokens for p in packs), default=None))
    return results


def report(results: dict[str, dict[str, Any]], command: str, seed: int) -> str:
    lines = [f"Command: `{command}`", "",
             f"Model: Qwen2, hidden {HIDDEN}, {LAYERS} layers, MLP {INTERMEDIATE}, {HEADS} heads ({KV_HEADS} KV), "
             f"vocabulary {VOCAB}, float32, 1 thread. Batch: {N} completions, padded micro-batches of {MICRO}; "
             f"prompts {PROMPT[0]}-{PROMPT[1]} tokens. Medians over rounds, the modes alternating in one process.",
             ""]
    for spread, modes in results.items():
        batch = rollouts(spread, seed)
        lengths = batch.completion_attention.sum(1)
        lines += [f"### {spread}: {SPREADS[spread][0]}", "",
                  f"Completions: min {int(lengths.min())}, mean {float(lengths.float().mean()):.0f}, "
                  f"max {int(lengths.max())} tokens; padded rows "
                  f"{batch.prompt_ids.shape[1] + batch.completion_ids.shape[1]} tokens wide, "
                  f"**{fill(batch):.1%} real tokens**.", "",
                  "| mode | route | micro-batches | largest pack | CPU s per step | speed-up (CPU) | wall s | "
                  "speed-up (wall) | loss of step 1 |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        padded = statistics.median(modes["padded"]["cpu_s"])
        padded_wall = statistics.median(modes["padded"]["step_s"])
        for mode in MODES:
            row = modes[mode]
            cpu, wall = statistics.median(row["cpu_s"]), statistics.median(row["step_s"])
            largest = "-" if row["largest_pack"] is None else row["largest_pack"]
            lines.append(f"| {mode} | {row['route']} | {row['micro_batches']} | {largest} | {cpu:.2f} | "
                         f"{padded / cpu:.2f}x | {wall:.2f} | {padded_wall / wall:.2f}x | {row['first_loss']:.6f} |")
        lines += ["", "Every round (CPU s / wall s):", ""]
        lines += [f"- {mode}: " + "; ".join(f"{c:.2f} / {w:.2f}" for c, w in zip(modes[mode]["cpu_s"],
                                                                              modes[mode]["step_s"]))
                  for mode in MODES]
        lines.append("")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = CommandParser(prog="python -m grpo_engine.tools.packing_bench",
                           description=doc_summary(__doc__, first_line=True))
    parser.add_argument("--spreads", nargs="*", default=list(SPREADS), help=f"of {', '.join(SPREADS)}")
    parser.add_argument("--rounds", type=positive_int, default=5, help="timed rounds of every mode, alternating")
    parser.add_argument("--seed", type=bounded_int(0, MAX_SEED, "a seed"), default=0)
    args = parser.parse_args(argv)
    unknown = [s for s in args.spreads if s not in SPREADS]
    if unknown or not args.spreads or len(set(args.spreads)) != len(args.spreads):  # twice: measured once, silently
        parser.error(f"--spreads must be some of {', '.join(SPREADS)}, each once, got {args.spreads}")
    results = {spread: measure_spread(spread, args.rounds, args.seed) for spread in args.spreads}
    print(report(results, "python -m grpo_engine.tools.packing_bench " + " ".join(argv or sys.argv[1:]), args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m grpo_engine.tools.packing_bench"))
