"""Per-step metrics (TRL names) and their sinks: metrics.jsonl always, TensorBoard / wandb on request.

Only the main process writes. On resume, lines of steps after the checkpoint are dropped first, so the
file of a resumed run reads as if the run had never stopped.
"""

from __future__ import annotations

import json
import logging
import math
import resource
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import torch

from .atomic_file import write_atomically
from .bounded_read import RUN_LOG_LINE_BYTES, bounded_lines, parse_json, require_regular_file
from .run_files import logged_step

_log = logging.getLogger(__name__)  # grpo_engine/messages.py: how the CLI shows it

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
    """(row, its line) of each line of a run's JSONL file, each line read within RUN_LOG_LINE_BYTES. A last line
    cut off mid-write (what a kill during a write leaves) is left out with a warning; an unreadable line anywhere
    else is an error naming it. A row the engine did not write as it is (its "step" not an integer >= 0: a hand
    edit such as `"step": "3"`) is left out with a warning naming its line: the checkpoints' history copies hold
    the run's own lines, and a resume keeps the file as it was beside the rebuilt one."""
    # A UTF-8 byte order mark opening a line (an editor saved the log, two such files concatenated) is no part of
    # its row, as in data files: it made a readable log "not a JSON object" and refused plot and resume.
    lines = [(number, raw.decode(errors="replace").removeprefix("\ufeff"), raw)
             for number, raw in bounded_lines(path, RUN_LOG_LINE_BYTES, "a line of a run's log") if raw.strip()]
    rows = []
    for index, (number, line, raw) in enumerate(lines):
        try:
            row = parse_json(line, f"{path}:{number}")
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict) and logged_step(row) is not None:
            rows.append((row, line))
        elif isinstance(row, dict):
            _log.warning(f"warning: {path}: line {number} has \"step\" {_shown(row.get('step'))}, which the engine "
                         f"never writes (an integer >= 0); the line is left out")
        elif index == len(lines) - 1 and _cut_off(raw):
            _log.warning(f"warning: {path}: the last line (line {number}) was cut off mid-write; it is left out")
        else:
            raise ValueError(f"{path}: line {number} {_not_a_row(raw, line)}")
    return rows


def _encoding_problem(raw: bytes) -> Optional[tuple[str, bool]]:
    """(why the bytes of a line are not UTF-8 text, whether a write cut off mid-character explains it), or None.
    A NUL byte is valid UTF-8 but never in JSON text: a log an editor saved as UTF-16 or UTF-32 reads so."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"byte 0x{raw[exc.start]:02x} at column {exc.start + 1}", exc.end == len(raw)
    if b"\x00" in raw:
        column = raw.index(b"\x00") + 1
        # NULs that read as JSON in a wide encoding are a log saved so; other NULs at the end are what a crash
        # leaves (a file extended before its data reached the disk reads back zeros): a cut-off last line
        return f"byte 0x00 at column {column}, as in UTF-16 or UTF-32", not _wide_text(raw)
    return None


def _wide_text(raw: bytes) -> bool:
    """Whether `raw` reads as a JSON line in UTF-16 or UTF-32 (either byte order; a line split at b'\n' may start
    with the newline's other byte)."""
    for encoding in ("utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"):
        width = 2 if "16" in encoding else 4
        for start in range(width):
            body = raw[start:]
            body = body[:len(body) - len(body) % width]
            try:
                text = body.decode(encoding).lstrip("\ufeff").strip()
            except UnicodeDecodeError:
                continue
            if text.startswith("{"):
                return True
    return False


def _cut_off(raw: bytes) -> bool:
    """Whether a last line could be one cut off mid-write: UTF-8 but for the first bytes of a character at its end
    (the only line of a UTF-16 log was left out as cut off instead)."""
    problem = _encoding_problem(raw)
    return problem is None or problem[1]


def _not_a_row(raw: bytes, line: str) -> str:
    """What a line that is no row is: bytes of another encoding (a log an editor saved as UTF-16 showed as
    '\ufffd\ufffd{\x00"\x00s\x00...'), or text that is not a JSON object."""
    problem = _encoding_problem(raw)
    if problem is not None:
        return f"is not UTF-8 text ({problem[0]}): the engine writes its logs in UTF-8; save the file as UTF-8"
    return f"is not a JSON object: {line[:80]!r}"


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


HISTORY_DIR = "history"  # in each checkpoint: the run's metrics and samples lines up to its step
HISTORY_FILES = (METRICS_FILE, SAMPLES_FILE)


def lines_up_to(path: Path, last_step: int) -> list[str]:
    """The whole lines of a JSONL file whose step is <= last_step (none when the file does not exist)."""
    if not path.is_file():
        return []
    return [line for row, line in jsonl_rows(path) if row["step"] <= last_step]


def save_history(run_dir: Path, checkpoint_dir: Path, step: int) -> None:
    """Copy the run's history up to `step` into a checkpoint being written: the checkpoint then implies its step's
    logs, whatever later happens to the run directory's files (a line cut off mid-write, a deleted file)."""
    history = checkpoint_dir / HISTORY_DIR
    history.mkdir(parents=True, exist_ok=True)
    for name in HISTORY_FILES:
        (history / name).write_text("".join(line + "\n" for line in lines_up_to(run_dir / name, step)))


def restore_history(path: Path, last_step: int, checkpoint_dir: Optional[Path]) -> None:
    """The history a run resumed at `last_step` goes on from: the checkpoint's copy (every line up to its step,
    whole), with the lines up to that step that the run directory's file holds and the copy does not (an
    evaluation logged after the save), in step order. A checkpoint without a copy (older ones) keeps the file's
    lines up to its step. Anything dropped from the file (lines after the step, which the resumed run writes
    again, or a line cut off mid-write) is kept beside it as `<file>.replaced-at-step-NNNNNN`."""
    saved = checkpoint_dir / HISTORY_DIR / path.name if checkpoint_dir is not None else None
    current = lines_up_to(path, last_step)
    if saved is not None and saved.is_file():
        copy = [line for _, line in jsonl_rows(saved)]  # verified by the checkpoint's checksums
        # The file's own lines once each: a file holding a line twice (two copies of the log concatenated, a sync
        # tool appending it again) put an evaluation logged after the save into the rebuilt log twice.
        known, lines = set(copy), list(copy)
        for line in current:
            if line not in known:
                known.add(line)
                lines.append(line)
        # by step, then the copy's order (a stable sort)
        kept = [line for _, _, line in sorted((logged_step(json.loads(line)), i, line)
                                              for i, line in enumerate(lines))]
    else:
        kept = current
    text = "".join(line + "\n" for line in kept)
    if path.is_file() and path.read_text(errors="replace") != text:
        # copied aside, then replaced whole: stopped anywhere, the file or its copy holds every line it held
        write_atomically(path.with_name(f"{path.name}.replaced-at-step-{last_step:06d}"), path.read_bytes())
    write_atomically(path, text)


class MetricsLogger:
    def __init__(self, run_dir: Path, report_to: list[str], enabled: bool, config: Optional[dict] = None,
                 resume_step: Optional[int] = None, resume_checkpoint: Optional[Path] = None) -> None:
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
            restore_history(self.path, resume_step, resume_checkpoint)
            restore_history(self.samples_path, resume_step, resume_checkpoint)
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
    require_regular_file(path, "a run's metrics.jsonl")  # a FIFO would block, and is no missing file
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: is {str(run_dir)!r} a run directory?")
    return [row for row, _ in jsonl_rows(path)]
