"""What a `--resume DIR` that is no checkpoint is, said before any work.

Users name the directory they see: the run directory, its `checkpoints/`, a checkpoint's `model/`, a path relative
to the run directory from another working directory, or a save that never finished. Each was "is not a checkpoint
directory (no trainer_state.json)" after the imports, even for a path that does not exist or a partial save the
engine had just removed (so the file it named was there a moment before). Imports no torch: the CLI calls it first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .checkpoint_error import CheckpointError
from .run_files import STATE_FILE, checkpoint_root, list_checkpoints

LATEST = "latest"  # --resume with no value
PARTIAL = ".tmp-"  # a save being written (checkpoint.temporary_dir): removed by the next resume


def _newest_in(directory: Path) -> Optional[Path]:
    """The newest checkpoint of a run directory, or of a run's checkpoints/ directory itself."""
    found = list_checkpoints(directory) or (list_checkpoints(directory.parent)
                                            if directory.name == checkpoint_root(".").name else [])
    return found[-1] if found else None


def _what_it_is(path: Path, run_dir: Path) -> Optional[str]:
    """Why `path` is no checkpoint, with the way to what was meant; None for a checkpoint directory."""
    partial = path.name.startswith(PARTIAL)
    if (path / STATE_FILE).is_file() and not partial:
        return None
    if not path.exists():
        where = "" if path.is_absolute() else f" (read from the working directory {Path.cwd()})"
        inside = run_dir / path
        meant = f"; did you mean {inside}?" if not path.is_absolute() and (inside / STATE_FILE).is_file() else ""
        return f"does not exist{where}{meant}"
    if not path.is_dir():
        return "is a file, not a checkpoint directory"
    if partial:
        return ("is a save that never completed (the engine removes it on resume); name a complete checkpoint, or "
                "give --resume with no value for the newest intact one")
    if (path.parent / STATE_FILE).is_file():
        return f"is the {path.name}/ inside the checkpoint {path.parent}; name the checkpoint directory itself"
    newest = _newest_in(path)
    if newest is not None:
        return (f"is a run's directory, not one checkpoint (its newest: {newest}); name a checkpoint, or give "
                f"--resume with no value and --output-dir for the run's newest intact one")
    return f"is not a checkpoint directory (no {STATE_FILE})"


def check_resume_target(resume: Optional[str], run_dir: str | Path) -> None:
    """One line naming run.resume when it names a directory that is no checkpoint."""
    if not resume or resume == LATEST:
        return
    problem = _what_it_is(Path(resume), Path(run_dir))
    if problem is not None:
        raise CheckpointError(f"run.resume / --resume {resume!r} {problem}")
