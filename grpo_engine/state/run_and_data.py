"""The run directory (and a file a command writes: eval's --output) stays apart from the data the command reads.

`--data shards --output-dir shards` was accepted: the run wrote its checkpoints/, metrics and base_model/ among the
data files, and the next load of that directory refused it ("it holds checkpoints"), the data now mixed with a
run. A run directory inside a data directory did the same (through a link too), and a data file at a name the run
writes (run/samples.jsonl) would be written over; `eval --data d.jsonl --output d.jsonl` replaced the data with its
metrics. Each is one line naming the option, before any work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

from .run_lock import OUTPUT_KEY, RUN_DIRECTORY_DIRS, RUN_DIRECTORY_FILES, RunDirectoryError, resolved


def _data_file_written_by_the_run(data: Path, run_dir: Path) -> bool:
    """Whether the run writes `data` itself: a file of the run directory's own names, or anything under its
    checkpoints/ or base_model/."""
    if data.parent == run_dir and data.name in RUN_DIRECTORY_FILES:
        return True
    return any(data.is_relative_to(run_dir / name) for name in RUN_DIRECTORY_DIRS)


def check_apart_from_data(output: str | Path, data_paths: Iterable[Optional[str]], key: str = OUTPUT_KEY,
                          run_directory: bool = True) -> None:
    """One line naming `key` when `output` (a run directory, or with `run_directory` false a file a command writes)
    is a dataset's path, lies inside a dataset's directory, or (a run directory) holds a dataset where the run writes
    its own files. Paths that name no local file (a Hub id) are not compared."""
    written = resolved(output, key)
    for given in data_paths:
        if given is None or not Path(given).expanduser().exists():
            continue
        data = resolved(given, f"the dataset {given!r}")
        if written == data:
            raise RunDirectoryError(f"{key} {str(output)!r} is the dataset {given!r}: writing there would replace the "
                                    f"data or mix with it; choose a path outside it")
        if data.is_dir() and written.is_relative_to(data):
            raise RunDirectoryError(f"{key} {str(output)!r} lies inside the dataset directory {given!r}, which would "
                                    f"then hold what is written as data; choose a path outside it")
        if run_directory and _data_file_written_by_the_run(data, written):
            raise RunDirectoryError(f"{key} {str(output)!r} holds the dataset {given!r} where the run writes its "
                                    f"own files; move the data, or choose another directory")
