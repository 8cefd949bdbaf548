"""Does the built-in demo keep its promise on this machine? `python -m grpo_engine.tools.demo_seeds`.

Runs `grpo-engine train` (no arguments besides the seed and a run directory) once per seed, each in its own
process so its wall and CPU time are its own, then scores the starting model (after the warm start) and the
final model on the task's prompts, sampled as training evaluates and greedily as `grpo-engine eval` does,
and prints one row per seed with the demo's targets checked:

- sampled accuracy >= 0.95 and greedy accuracy >= 0.98 after training;
- no late collapse: the mean reward of the last 10 % of steps within 0.05 of the best 10 % window.

Extra arguments go to `grpo-engine train` unchanged (`python -m grpo_engine.tools.demo_seeds -- --run.max_steps 200`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch

from ..cli_parser import CommandParser, doc_summary
from ..cli_types import bounded_int, output_directory, positive_int
from ..command_failure import run_tool
from ..config import load_config
from ..config.schema import MAX_SEED
from ..data.demo_task import DEMO_PRESET
from ..state.checkpoint import list_checkpoints, model_dir
from ..state.metrics import read_metrics
from .train_flags import check_train_flags

SAMPLED_TARGET = 0.95
GREEDY_TARGET = 0.98
COLLAPSE_TOLERANCE = 0.05
# Sampled evaluation seeds torch's global RNG: one evaluation at a time keeps it reproducible.
_EVAL_LOCK = threading.Lock()


@dataclass
class SeedResult:
    seed: int
    sampled_before: float
    sampled_after: float
    greedy_before: float
    greedy_after: float
    reward_first: float  # mean reward of the first 10 % of steps
    reward_last: float  # ... of the last 10 %
    reward_best: float  # the best mean over any window of 10 % of the steps
    wall_s: float
    cpu_s: float  # user + system time of the training process

    @property
    def no_late_collapse(self) -> bool:
        return self.reward_best - self.reward_last <= COLLAPSE_TOLERANCE

    @property
    def passed(self) -> bool:
        return (self.sampled_after >= SAMPLED_TARGET and self.greedy_after >= GREEDY_TARGET
                and self.no_late_collapse)


def reward_windows(rewards: Sequence[float]) -> tuple[float, float, float]:
    """(first, last, best) mean over windows of 10 % of the steps (at least one step)."""
    if not rewards:
        raise ValueError("reward_windows needs at least one step's reward")
    width = max(1, len(rewards) // 10)
    means = [sum(rewards[i: i + width]) / width for i in range(len(rewards) - width + 1)]
    return means[0], means[-1], max(means)


def timed_run(command: list[str], log_path: Path) -> tuple[float, float]:
    """Runs `command` with its output in `log_path`; returns (wall, user + system CPU) seconds of that child."""
    start = time.perf_counter()
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        # wait4 reports this child's own resource usage, even while other seeds run in parallel.
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit {process.returncode}); see {log_path}")
    return wall, usage.ru_utime + usage.ru_stime


def task_accuracy(model_path: Path, seed: int, greedy: bool) -> float:
    """Accuracy on the demo's evaluation prompts: greedy, or sampled exactly as the trainer's evaluation."""
    from .evaluate import run_eval

    config = load_config(overrides={"run.seed": seed}, preset=DEMO_PRESET)
    samples = 1 if greedy else config.run.eval_num_samples
    with _EVAL_LOCK:
        return run_eval(config, str(model_path), samples, greedy=greedy, batch_size=64)["accuracy"]


def run_seed(seed: int, output_dir: Path, train_args: Sequence[str]) -> SeedResult:
    run_dir = output_dir / f"seed-{seed}"
    command = [sys.executable, "-m", "grpo_engine", "train", "--run.seed", str(seed), "--output-dir", str(run_dir),
               "--run.progress_bar", "false", *train_args]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    wall, cpu = timed_run(command, output_dir / f"seed-{seed}.log")
    return seed_result(seed, run_dir, wall, cpu)


def seed_result(seed: int, run_dir: Path, wall: float, cpu: float) -> SeedResult:
    """The row of a finished demo run: its reward curve, and its start and final models scored."""
    rewards = [row["reward"] for row in read_metrics(run_dir) if "reward" in row]
    first, last, best = reward_windows(rewards)
    start, final = run_dir / "base_model", model_dir(list_checkpoints(run_dir)[-1])
    return SeedResult(seed, task_accuracy(start, seed, greedy=False), task_accuracy(final, seed, greedy=False),
                      task_accuracy(start, seed, greedy=True), task_accuracy(final, seed, greedy=True),
                      first, last, best, wall, cpu)


def format_table(results: Sequence[SeedResult]) -> str:
    lines = ["| seed | sampled acc. start -> end | greedy acc. start -> end | reward first -> last 10 % (best) "
             "| no late collapse | wall s | CPU s | targets met |",
             "|---:|---|---|---|---|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r.seed} | {r.sampled_before:.3f} -> {r.sampled_after:.3f} | {r.greedy_before:.2f} -> "
                     f"{r.greedy_after:.2f} | {r.reward_first:.3f} -> {r.reward_last:.3f} ({r.reward_best:.3f}) | "
                     f"{'yes' if r.no_late_collapse else 'NO'} | {r.wall_s:.1f} | {r.cpu_s:.1f} | "
                     f"{'yes' if r.passed else 'NO'} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = CommandParser(prog="python -m grpo_engine.tools.demo_seeds", description=doc_summary(__doc__))
    parser.add_argument("--seeds", type=bounded_int(0, MAX_SEED, "a seed"), nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--jobs", type=positive_int, default=1, help="seeds trained at once (one CPU thread each)")
    parser.add_argument("--output-dir", type=output_directory, default="runs/demo-seeds",
                        help="one run directory per seed inside it")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="after --: flags for grpo-engine train")
    args = parser.parse_args(argv)
    output_dir = Path(args.output_dir)
    existing = [s for s in args.seeds if (output_dir / f"seed-{s}").exists()]
    if existing:
        parser.error(f"--output-dir {output_dir} already holds runs for seeds {existing}: choose another directory")
    twice = sorted({seed for seed in args.seeds if args.seeds.count(seed) > 1})
    if twice:  # one run directory per seed: the second run of a seed found the first's, or fought it for its lock
        parser.error(f"argument --seeds: {', '.join(map(str, twice))} given more than once; name each seed once")
    train_args = [a for a in args.train_args if a != "--"]
    check_train_flags(train_args, ["--run.progress_bar", "false"])  # before the first run, not in its log
    torch.set_num_threads(1)  # the evaluations of a 0.1 M-parameter model, while other seeds train
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda seed: run_seed(seed, output_dir, train_args), args.seeds))
    print(format_table(results))
    failed = [r.seed for r in results if not r.passed]
    print(f"all {len(results)} seeds meet the targets" if not failed else f"seeds missing the targets: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m grpo_engine.tools.demo_seeds"))
