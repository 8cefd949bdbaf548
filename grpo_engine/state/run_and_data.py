"""The run directory (and a file a command writes: eval's --output) stays apart from what the command reads: its
datasets and its model directory.

`--data shards --output-dir shards` was accepted: the run wrote its checkpoints/, metrics and base_model/ among the
data files, and the next load of that directory refused it ("it holds checkpoints"), the data now mixed with a
run. A run directory inside a data directory did the same (through a link too), and a data file at a name the run
writes (run/samples.jsonl) would be written over; `eval --data d.jsonl --output d.jsonl` replaced the data with its
metrics, and `--output m/config.json` the model's own config. A model inside a run's checkpoints/ was deleted by
rotation (run.save_total_limit) while the run trained from it. Each is one line naming the option, before any
work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

from .run_lock import OUTPUT_KEY, RUN_DIRECTORY_DIRS, RUN_DIRECTORY_FILES, RunDirectoryError, resolved


def _written_by_the_run(path: Path, run_dir: Path) -> bool:
    """Whether the run writes (or rotation deletes) `path` itself: a file of the run directory's own names, or
    anything under its checkpoints/ or base_model/."""
    if path.parent == run_dir and path.name in RUN_DIRECTORY_FILES:
        return True
    return any(path.is_relative_to(run_dir / name) for name in RUN_DIRECTORY_DIRS)


def inputs_of(data_path: Optional[str], eval_path: Optional[str] = None,
              model: Optional[str] = None) -> list[tuple[str, Optional[str]]]:
    """(what it is, path) of what a command reads, for check_apart_from_data."""
    return [("dataset", data_path), ("evaluation dataset", eval_path), ("model directory", model)]


def check_apart_from_data(output: str | Path, inputs: Iterable[tuple[str, Optional[str]]], key: str = OUTPUT_KEY,
                          run_directory: bool = True) -> None:
    """One line naming `key` when `output` (a run directory, or with `run_directory` false a file a command writes)
    is an input's path (inputs_of: the datasets, the model directory), lies inside a dataset's directory (a file
    inside the model's too: it would replace one of its files), or (a run directory) holds an input where the run
    writes its own files or rotation deletes checkpoints. Paths that name no local file (a Hub id) are not compared."""
    written = resolved(output, key)
    for what, given in inputs:
        if given is None or not Path(given).expanduser().exists():
            continue
        read = resolved(given, f"the {what} {given!r}")
        if written == read:
            raise RunDirectoryError(f"{key} {str(output)!r} is the {what} {given!r}: writing there would replace it "
                                    f"or mix with it; choose a path outside it")
        inside = what != "model directory" or not run_directory
        if inside and read.is_dir() and written.is_relative_to(read):
            raise RunDirectoryError(f"{key} {str(output)!r} lies inside the {what} {given!r}, which would then hold "
                                    f"what is written there; choose a path outside it")
        if run_directory and _written_by_the_run(read, written):
            raise RunDirectoryError(f"{key} {str(output)!r} holds the {what} {given!r} where the run writes its own "
                                    f"files (or deletes old checkpoints); move it, or choose another directory")
