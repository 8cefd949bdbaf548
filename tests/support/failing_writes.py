"""Writes that stop midway, for the tests of what a stopped write leaves: every file opened for writing through
`open` (builtins and io, which pathlib uses) counts the bytes written to it, all files together; the write that
reaches `after_bytes` writes its part up to that point, flushes it to disk and raises `error`, as a full disk, a
signal or a crash there would. `at_stage` instead raises at a later stage of a safe write: the fsync or the
rename."""

from __future__ import annotations

import builtins
import io
import os
from typing import Any

import pytest

STAGES = ("write", "fsync", "rename")


class _CountedFile:
    def __init__(self, file: Any, budget: list, error: BaseException) -> None:
        self._file, self._budget, self._error = file, budget, error

    def write(self, data):
        if len(data) >= self._budget[0]:
            self._file.write(data[:self._budget[0]])
            self._file.flush()
            self._budget[0] = 0
            raise self._error
        self._budget[0] -= len(data)
        return self._file.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self._file.close()

    def __iter__(self):
        return iter(self._file)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


def stop_writes(monkeypatch: pytest.MonkeyPatch, stage: str, after_bytes: int, error: BaseException) -> None:
    """From now on (until monkeypatch undoes it) the first write to reach the given stage raises `error`."""
    if stage == "fsync":
        def failing_fsync(fd: int) -> None:
            raise error
        monkeypatch.setattr(os, "fsync", failing_fsync)
        return
    if stage == "rename":
        def failing_replace(source, target) -> None:
            raise error
        monkeypatch.setattr(os, "replace", failing_replace)
        return
    real_open, budget = builtins.open, [after_bytes]

    def counted_open(file, mode: str = "r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        writing = any(flag in mode for flag in "wax+") and not isinstance(file, int)
        return _CountedFile(handle, budget, error) if writing else handle

    monkeypatch.setattr(builtins, "open", counted_open)
    monkeypatch.setattr(io, "open", counted_open)
