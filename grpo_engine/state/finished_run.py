"""A run directory whose run has finished: `grpo-engine train` run again with the same options reports it and
its results instead of refusing; a larger run.max_steps with --resume trains it on (start_point)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..config import EngineConfig, config_from_yaml
from . import checkpoint as ckpt
from .metrics import METRICS_FILE, read_metrics
from .run_summary import summary_lines


class RunFinished(Exception):
    """This config's run is already done in its run directory; the message reports it and its results."""


def finished_step(run_dir: Path) -> Optional[tuple[ckpt.ResumePoint, EngineConfig]]:
    """The newest intact checkpoint and the config it was saved with, when that checkpoint ends its run."""
    if not ckpt.list_checkpoints(run_dir):
        return None
    try:
        point = ckpt.resolve_resume("latest", run_dir)
        saved = config_from_yaml(ckpt.saved_config(point.path), f"{point.path}/config.yaml")
    except (ckpt.CheckpointError, ValueError):
        return None  # a damaged or foreign run: the fresh-directory check names what it holds
    return (point, saved) if point.step >= saved.run.max_steps else None


def report(run_dir: Path, point: ckpt.ResumePoint, config: EngineConfig) -> str:
    rows = read_metrics(run_dir) if (run_dir / METRICS_FILE).is_file() else []
    rewards = [row["reward"] for row in rows if "reward" in row]
    evals = [row for row in rows if "eval_accuracy" in row]
    last_eval = None if not evals else {"accuracy": evals[-1]["eval_accuracy"],
                                        "num_prompts": evals[-1].get("eval_num_prompts", 0)}
    first_eval = {"accuracy": evals[0]["eval_accuracy"]} if evals and evals[0]["step"] == 0 else None
    lines = [f"{run_dir} holds this run, finished: step {point.step} of {point.step} ({point.path.name})",
             *summary_lines(rewards, first_eval, last_eval, config),
             f"run directory: {run_dir} (metrics.jsonl, samples.jsonl, curves.png, checkpoints/)",
             f"to train it on: the same command with --resume --run.max_steps N (N > {point.step}); for a fresh "
             f"run: another --output-dir"]
    return "\n".join(lines)
