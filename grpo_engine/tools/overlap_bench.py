"""Step time with the next batch generated while this one trains (rollout.max_staleness 1) against on-policy turns
(0), through a running vLLM server (rollout.backend vllm_server).

The same run (the built-in addition task, the model the server serves, one thread for the trainer) is trained
for --steps steps at each setting; the step time is the median over the steps after the first --skip (start-up,
first-call allocations). Also reported: the phases of a step (generate: waiting for the batch; update; push:
waiting for the generation in flight, then the weight push) and the staleness the runs had.
    python -m grpo_engine.tools.overlap_bench --url http://127.0.0.1:8000 --model DIR --steps 12
"""

from __future__ import annotations

import sys

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from ..cli_parser import CommandParser
from ..cli_types import bounded_int, positive_int
from ..command_failure import run_tool


def run(url: str, model: str, staleness: int, args: argparse.Namespace, output_dir: str) -> dict[str, float]:
    from grpo_engine.config import load_config
    from grpo_engine.state.metrics import read_metrics
    from grpo_engine.trainer import train

    config = load_config(None, {
        "model.name_or_path": model, "rollout.backend": "vllm_server", "rollout.server.urls": [url],
        "rollout.max_staleness": staleness, "run.output_dir": output_dir, "run.max_steps": args.steps,
        "run.progress_bar": False, "run.plot": False, "run.log_completions_steps": 0, "run.num_threads": 1,
        "data.max_prompt_length": 32, "data.builtin_max_operand": 9,
        "rollout.num_generations": args.generations, "rollout.max_new_tokens": args.max_new_tokens,
        "rollout.temperature": 0.8, "optim.per_device_train_batch_size": args.batch,
        "optim.num_iterations": args.iterations, "optim.learning_rate": 1e-4,
        "rewards.functions": ["math_accuracy", "length"], "rewards.length_cache": args.max_new_tokens})
    train(config)
    rows = [r for r in read_metrics(Path(output_dir)) if "loss" in r][args.skip:]
    median = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    return {"step_s": median("time/step"), "generate_s": median("time/generate"), "update_s": median("time/update"),
            "push_s": median("time/push"), "staleness_max": max(r["staleness/max"] for r in rows),
            "dropped": rows[-1]["staleness/dropped_samples"]}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = CommandParser(prog="python -m grpo_engine.tools.overlap_bench", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True, help="the directory the server serves")
    parser.add_argument("--steps", type=positive_int, default=12)
    parser.add_argument("--skip", type=bounded_int(0), default=2)
    parser.add_argument("--generations", type=positive_int, default=8)
    parser.add_argument("--batch", type=positive_int, default=16, help="completions per step")
    parser.add_argument("--iterations", type=positive_int, default=1, help="optim.num_iterations")
    parser.add_argument("--max-new-tokens", type=positive_int, default=16)
    args = parser.parse_args(argv)
    if args.skip >= args.steps:  # the median is over the steps after the skipped ones
        parser.error(f"argument --skip: expected fewer than --steps ({args.steps}) steps, got {args.skip}")
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for staleness in (0, 1):
            results[staleness] = run(args.url, args.model, staleness, args, f"{scratch}/s{staleness}")
    print(json.dumps(results, indent=2))
    print(f"speed-up of max_staleness 1 over 0: {results[0]['step_s'] / results[1]['step_s']:.2f}x")


if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m grpo_engine.tools.overlap_bench"))
