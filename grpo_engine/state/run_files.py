"""What the engine knows it wrote into a run directory: a manifest of its own files with their fingerprints.

A fresh run writes over no file it did not write (resume.check_nothing_to_overwrite); with the manifest it tells
its own earlier files (a start that failed: config.yaml, the demo's base_model/) from a user's, whatever the
config now is, by their fingerprints: a file edited since is the user's. A start that fails before its first step
in a directory that held no run's progress removes what it wrote (files that still match the manifest), so the
corrected command finds the directory as it was. Imports no torch: the CLI checks the run directory first.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any, Optional

from .atomic_file import write_atomically
from .bounded_read import RUN_LOG_LINE_BYTES, FileBoundError, bounded_lines, parse_json, read_json_file

MANIFEST = ".grpo-engine-files.json"
CHECKPOINT_PREFIX = "checkpoint-"
# The names the engine gives its checkpoints: checkpoint-NNNNNN, the step zero-padded to six digits (more digits
# without a leading zero past step 999999), so each step has exactly one name. Anything else under checkpoints/ (a
# backup copy `checkpoint-000002-keep`, `checkpoint-2`, `checkpoint-0000002`, a user's notes) is not one of them:
# never resumed from, never rotated away. (A second name for one step, `checkpoint-0000002`, was taken for step 2
# too: a resume picked either copy, and rotation could delete the user's.)
CHECKPOINT_NAME = re.compile(rf"{CHECKPOINT_PREFIX}(\d{{6}}|[1-9]\d{{6,}})")
LOG_FILES = ("metrics.jsonl", "samples.jsonl")
STATE_FILE = "trainer_state.json"  # a checkpoint's trainer state: a directory without it is no checkpoint


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_step(path: Path) -> Optional[int]:
    """The step in a checkpoint's name, or None for a name the engine does not write."""
    match = CHECKPOINT_NAME.fullmatch(path.name)
    return None if match is None else int(match.group(1))


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first: directories (or links to directories: a checkpoint moved to another disk
    and linked back) of the engine's names."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir()
             if checkpoint_step(p) is not None and p.is_dir() and (p / STATE_FILE).is_file()]
    return sorted(found, key=checkpoint_step)


def logged_step(row: dict[str, Any]) -> Optional[int]:
    """The step of a log row as the engine writes it (an integer >= 0), or None for a row it did not write."""
    step = row.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None


def fingerprint(path: Path) -> str:
    """SHA-256 of a file, or of a directory's relative file names and contents."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        digest.update(str(file.relative_to(path)).encode() + b"\0")
        with file.open("rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()


def _manifest(run_dir: Path) -> dict[str, str]:
    try:
        entries = read_json_file(run_dir / MANIFEST, "the run directory's manifest")
    except (OSError, ValueError):
        return {}  # none, or not one the engine wrote: nothing is known to be the engine's
    if not isinstance(entries, dict):
        return {}
    # Only names the engine gives its own files: one component directly under the run directory. A manifest edited
    # by hand or by a tool ('../notes.txt', an absolute path) names nothing the engine wrote, and a failed start
    # would otherwise remove a file outside the run directory whose fingerprint it was given.
    return {k: v for k, v in entries.items() if isinstance(v, str) and _own_name(k)}


def _own_name(name: object) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and Path(name).name == name and "\\" not in name \
        and not name.startswith(".")


def record_own(run_dir: Path, name: str) -> None:
    """Enter `name` (a file or directory under run_dir, just written by the engine) into the manifest."""
    entries = _manifest(run_dir)
    entries[name] = fingerprint(run_dir / name)
    write_atomically(run_dir / MANIFEST, json.dumps(entries, indent=1))


def is_own(run_dir: Path, name: str) -> bool:
    """`name` is as the engine wrote it: in the manifest, its fingerprint unchanged."""
    path = run_dir / name
    expected = _manifest(run_dir).get(name)
    return expected is not None and path.exists() and not path.is_symlink() and fingerprint(path) == expected


def has_progress(run_dir: Path) -> bool:
    """A run got somewhere here: a checkpoint (of the engine's names), or a logged row of a step >= 1."""
    root = run_dir / "checkpoints"
    if root.is_dir() and any(CHECKPOINT_NAME.fullmatch(p.name) for p in root.iterdir()):
        return True
    for name in LOG_FILES:
        path = run_dir / name
        if not path.is_file():
            continue
        try:
            for _, line in bounded_lines(path, RUN_LOG_LINE_BYTES, "a line of a run's log"):
                try:
                    row = parse_json(line, str(path))
                except ValueError:
                    return True  # a line the engine cannot read: keep everything
                if not isinstance(row, dict) or (logged_step(row) or 0) >= 1:
                    return True
        except FileBoundError:
            return True
    return False


def remove_own_start(run_dir: Path, present_before: set[str]) -> list[str]:
    """After a start that failed before step 1 where no run had progress: remove what it wrote and is unchanged
    (manifest entries, and the run logs it created, which then hold no step past 0; `present_before`: the names
    the directory held when the start began, none of which is the start's); returns the names removed."""
    removed = []
    for name in list(_manifest(run_dir)):
        if is_own(run_dir, name):
            path = run_dir / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
            removed.append(name)
    for name in LOG_FILES:
        if name not in present_before and (run_dir / name).is_file():
            (run_dir / name).unlink()
            removed.append(name)
    (run_dir / MANIFEST).unlink(missing_ok=True)
    return removed
