"""The standard streams a command starts with: closed ones (`>&-`, `2>&-`, `<&-`, a daemon's launch) are opened on
/dev/null, and stdout or stderr whose writes fail (a full disk, /dev/full, an I/O error) drop what is written to them
from the first failure on, so the command goes on; a lost stdout is said in one line at the end.

Before, a closed stdout made every note of a run print logging's "--- Logging error ---" traceback (sys.stdout was
None), a file the run opened could take the free descriptor 1 or 2 and receive what a library or a reward function's
child process writes there, and stdout on /dev/full ended a run that had trained and saved with "OSError: [Errno 28]
No space left on device", naming no file. A reader gone (EPIPE: `| head`) is handled where it is met
(grpo_engine/messages.py): the command ends quietly, as a Unix tool does.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any, Optional

_STREAMS = ((0, "stdin", os.O_RDONLY, "r"), (1, "stdout", os.O_WRONLY, "w"), (2, "stderr", os.O_WRONLY, "w"))


def open_closed_streams() -> None:
    """Opens each of descriptors 0, 1 and 2 that is closed on /dev/null (and the Python stream over it)."""
    for fd, name, flags, mode in _STREAMS:
        try:
            os.fstat(fd)
            continue
        except OSError:  # EBADF: closed by whoever started the process
            pass
        try:
            null = os.open(os.devnull, flags)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            if getattr(sys, name) is None:
                setattr(sys, name, open(fd, mode, encoding="utf-8", errors="backslashreplace", closefd=False))
        except OSError:  # no /dev/null: nothing better to offer
            continue


class StreamGuard:
    """A text stream whose writes and flushes go through `_guarded` (a subclass's reaction to their errors);
    everything else is the stream's own."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _guarded(self, operation, *args):
        return operation(*args)

    def write(self, text: str):
        result = self._guarded(self._stream.write, text)
        return len(text) if result is None else result

    def flush(self) -> None:
        self._guarded(self._stream.flush)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


class _DroppedWhenUnwritable(StreamGuard):
    """stdout or stderr: from the first write or flush that fails (except EPIPE) its descriptor is pointed at
    /dev/null and the failure is kept, for lost_output to say."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.failure: Optional[str] = None

    def _guarded(self, operation, *args):
        try:
            return operation(*args)
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # the reader has gone: grpo_engine/messages.py and the CLI end quietly
                raise
            if self.failure is None:
                self.failure = exc.strerror or str(exc)
            try:
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, self._stream.fileno())
                os.close(null)
                return operation(*args)  # the buffered text goes to /dev/null now
            except (OSError, ValueError):
                return None


def guard_output() -> None:
    """Wraps sys.stdout and sys.stderr that are a file descriptor's stream (not a capture) in _DroppedWhenUnwritable."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):  # None, a capture, a closed stream: left as it is
            continue
        if not isinstance(stream, _DroppedWhenUnwritable):
            setattr(sys, name, _DroppedWhenUnwritable(stream))


def lost_output() -> Optional[str]:
    """What to say when stdout could not be written (None when it could): the command's results printed there are
    lost, whatever else it did."""
    stream = sys.stdout
    if not isinstance(stream, _DroppedWhenUnwritable):
        return None
    stream.flush()
    if stream.failure is not None:
        return (f"could not write to stdout ({stream.failure}): what the command printed there from then on is lost "
                f"(the files it wrote are not: a run's results are in its run directory)")
    return None
