"""Per-step metrics (TRL names) and their sinks: metrics.jsonl always, TensorBoard / wandb on request.

Only the main process writes. On resume, lines of steps after the checkpoint are dropped first, so the
file of a resumed run reads as if the run had never stopped.
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"


class StepTimer:
    """Wall time of the named phases of one step (generate / score / logprobs / update)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.start = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - begin

    def metrics(self) -> dict[str, float]:
        out = {f"time/{name}": value for name, value in self.seconds.items()}
        out["time/step"] = time.perf_counter() - self.start
        return out


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    # ru_maxrss is KiB on Linux, bytes on macOS: the process's peak resident set.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def completion_metrics(lengths: torch.Tensor, truncated: torch.Tensor) -> dict[str, float]:
    lengths = lengths.float()
    terminated = lengths[~truncated]
    return {
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        "completions/clipped_ratio": truncated.float().mean().item(),
        # TRL reports 0 for the terminated lengths when every completion was truncated.
        "completions/mean_terminated_length": terminated.mean().item() if terminated.numel() else 0.0,
        "completions/min_terminated_length": terminated.min().item() if terminated.numel() else 0.0,
        "completions/max_terminated_length": terminated.max().item() if terminated.numel() else 0.0,
    }


def merge_metrics(*groups: dict[str, Any]) -> dict[str, Any]:
    """One step's metrics from its phases' (rewards, update, timing): a name two phases give is a bug, never
    one phase's value silently replacing another's."""
    merged: dict[str, Any] = {}
    for group in groups:
        clash = sorted(merged.keys() & group.keys())
        if clash:
            raise RuntimeError(f"two phases of the step report the metric {clash[0]!r}")
        merged.update(group)
    return merged


def json_safe(metrics: dict[str, Any]) -> dict[str, Any]:
    """NaN and infinities become None (JSON null): `json.dumps` would write NaN, which is not JSON."""
    return {name: None if isinstance(value, float) and not math.isfinite(value) else value
            for name, value in metrics.items()}


def jsonl_rows(path: Path) -> list[tuple[dict[str, Any], str]]:
    """(row, its line) of each line of a JSONL file. A last line cut off mid-write (what a kill during a write
    leaves) is left out with a warning; an unreadable line anywhere else is an error naming it."""
    lines = [(number, line) for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if line.strip()]
    rows = []
    for index, (number, line) in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict):
            rows.append((row, line))
        elif index == len(lines) - 1:
            print(f"warning: {path}: the last line (line {number}) was cut off mid-write; it is left out",
                  file=sys.stderr)
        else:
            raise ValueError(f"{path}: line {number} is not a JSON object: {line[:80]!r}")
    return rows


def truncate_after(path: Path, last_step: int) -> None:
    """Keep only the lines of steps <= last_step (a resumed run rewrites what came after; the checkpoint it
    resumes from says where the run is)."""
    if not path.is_file():
        return
    kept = [line for row, line in jsonl_rows(path) if row.get("step", 0) <= last_step]
    path.write_text("".join(line + "\n" for line in kept))


class MetricsLogger:
    def __init__(self, run_dir: Path, report_to: list[str], enabled: bool, config: Optional[dict] = None,
                 resume_step: Optional[int] = None) -> None:
        self.enabled = enabled
        self.path = run_dir / METRICS_FILE
        self.samples_path = run_dir / SAMPLES_FILE
        self.tensorboard = None
        self.wandb = None
        if not enabled:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
            self.samples_path.write_text("")
        else:
            truncate_after(self.path, resume_step)
            truncate_after(self.samples_path, resume_step)
        if "tensorboard" in report_to:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise ImportError("run.report_to has 'tensorboard': pip install tensorboard") from exc
            self.tensorboard = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        if "wandb" in report_to:
            try:
                import wandb
            except ImportError as exc:
                raise ImportError("run.report_to has 'wandb': pip install wandb") from exc
            self.wandb = wandb.init(dir=str(run_dir), config=config, resume="allow")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        metrics = json_safe(metrics)
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}, allow_nan=False) + "\n")
        if self.tensorboard is not None:
            for name, value in metrics.items():
                if isinstance(value, (int, float)):
                    self.tensorboard.add_scalar(name, value, step)
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def log_samples(self, step: int, prompts: list[str], completions: list[str], rewards: list[float]) -> None:
        if not self.enabled:
            return
        with self.samples_path.open("a") as f:
            for prompt, completion, reward in zip(prompts, completions, rewards):
                f.write(json.dumps({"step": step, "prompt": prompt, "completion": completion, "reward": reward}) + "\n")

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: is {str(run_dir)!r} a run directory?")
    return [row for row, _ in jsonl_rows(path)]
