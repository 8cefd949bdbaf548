"""Reading the files the engine did not write this session (run-directory logs, checkpoint state, data) within
stated bounds: a line or file past its bound, or JSON nested past what Python's reader can take, is one line
naming the file (and line) and the bound, never a stall on gigabytes or a RecursionError traceback.

The bounds are far above what the engine writes: a metrics.jsonl row is about 2 KB, a samples.jsonl row holds a
prompt (data.max_prompt_chars: 100,000 characters by default) and its completion, trainer_state.json and
checksums.json a few KB (one entry per file of a checkpoint).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Iterator

RUN_LOG_LINE_BYTES = 16 << 20  # one line of metrics.jsonl / samples.jsonl
STATE_FILE_BYTES = 16 << 20  # trainer_state.json, checksums.json
DATA_LINE_BYTES = 256 << 20  # one row of a JSONL dataset (the prompt bound is checked after, in characters)


class FileBoundError(ValueError):
    """A file (or one of its lines) past the reader's bound, or JSON nested too deep to read."""


def _mib(size: int) -> str:
    return f"{size / 2**20:g} MiB"


def special_file_kind(path: Path) -> str | None:
    """What `path` (its links followed) is when it exists and is neither a regular file nor a directory: 'a FIFO'
    (opening one blocks until a writer comes), 'a character device' (/dev/zero never ends, /dev/null is always
    empty), 'a block device', 'a socket'; None otherwise."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    for test, kind in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return None


def require_regular_file(path: Path, what: str) -> None:
    """Refuses, before opening it, a path that is a FIFO, a device or a socket: every reader here takes a file's
    end for the end of its content, which a pipe without a writer never reaches (open() blocks) and /dev/zero
    never has."""
    kind = special_file_kind(path)
    if kind is not None:
        raise FileBoundError(f"{path} is {kind}, not a regular file; {what} must be a regular file")


def read_bounded_bytes(path: Path, max_bytes: int, what: str) -> bytes:
    """The whole file, refused without reading past `max_bytes`."""
    require_regular_file(path, what)
    with Path(path).open("rb") as file:
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileBoundError(f"{path}: larger than {_mib(max_bytes)}, the bound for {what}; it is not a file the "
                             f"engine wrote")
    return data


def bounded_lines(path: Path, max_line_bytes: int, what: str) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, its bytes without the line break) of each line, read one at a time: a line longer
    than `max_line_bytes` is refused when reading reaches the bound, not after loading it. Only the bytes the file
    held when it was opened are read: a file written to as it is read (a run's log, data being generated) would
    otherwise never end."""
    require_regular_file(path, what)
    with Path(path).open("rb") as file:
        left = os.fstat(file.fileno()).st_size
        number = 0
        while left > 0:
            line = file.readline(min(max_line_bytes + 1, left))
            if not line:
                return
            left -= len(line)
            number += 1
            if len(line) > max_line_bytes and not line.endswith(b"\n"):
                raise FileBoundError(f"{path}:{number}: a line longer than {_mib(max_line_bytes)}, the bound for "
                                     f"{what}")
            yield number, line.rstrip(b"\r\n")


def parse_json(text: str | bytes, where: str, **options: Any) -> Any:
    """json.loads, with nesting past Python's recursion limit refused in one line naming `where`."""
    try:
        return json.loads(text, **options)
    except RecursionError:
        raise FileBoundError(f"{where}: JSON nested too deep to read (past Python's recursion limit)") from None


def read_json_file(path: Path, what: str, max_bytes: int = STATE_FILE_BYTES) -> Any:
    """A small JSON file the engine wrote (a checkpoint's state, its manifest), read within `max_bytes`."""
    return parse_json(read_bounded_bytes(path, max_bytes, what), str(path))
