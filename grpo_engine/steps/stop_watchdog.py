"""A small process that ends this one when a reward function does not stop after its time limit.

The time limit's exception (reward_timeout.py) reaches a function only when it runs Python and lets the exception
through. One stuck in C code (a regular expression backtracking for hours) holds the GIL, so no thread of this
process can run any more, not even a timer; one that catches BaseException in a loop swallows every stop. The
watchdog runs apart, with no GIL to wait for: armed before each call with the call's limit plus a grace, disarmed
after it, and when the time passes armed it writes its one line to this process's stderr and kills it (SIGKILL:
a Python signal handler would need the GIL). It reads its orders from a pipe and ends when the pipe closes, so it
never outlives the process it watches.
"""

from __future__ import annotations

import atexit
import logging
import os
import subprocess
import sys
from typing import Optional

_log = logging.getLogger(__name__)

# Orders, one line each: "arm SECONDS MESSAGE" or "disarm".
_WATCHER = r"""
import os, select, signal, sys, time
parent, pending, deadline, message = int(sys.argv[1]), b"", None, b""
while True:
    wait = None if deadline is None else max(0.0, deadline - time.monotonic())
    if not select.select([0], [], [], wait)[0]:
        os.write(2, message + b"\n")
        os.kill(parent, signal.SIGKILL)
        sys.exit(0)
    data = os.read(0, 65536)
    if not data:
        sys.exit(0)
    pending += data
    while b"\n" in pending:
        line, pending = pending.split(b"\n", 1)
        order, _, rest = line.partition(b" ")
        if order == b"arm":
            seconds, _, message = rest.partition(b" ")
            deadline = time.monotonic() + float(seconds)
        else:
            deadline = None
"""

_watcher: Optional[subprocess.Popen] = None


def _started() -> Optional[subprocess.Popen]:
    global _watcher
    if _watcher is not None and _watcher.poll() is None:
        return _watcher
    try:
        _watcher = subprocess.Popen([sys.executable, "-c", _WATCHER, str(os.getpid())], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, close_fds=True)
    except OSError as exc:  # no process can be started (a process limit): the limit's exception still stops most
        _log.warning(f"warning: cannot start the reward watchdog ({exc}); a reward function stuck in C code would "
                     f"not be stopped")
        return None
    atexit.register(_stop)
    return _watcher


def arm(seconds: float, message: str) -> None:
    """From now, `message` and the end of this process once `seconds` pass, unless `disarm` comes first."""
    _order(f"arm {seconds!r} {' '.join(message.split())}")


def disarm() -> None:
    _order("disarm")


def _order(line: str) -> None:
    watcher = _started() if line.startswith("arm") else _watcher
    if watcher is None:
        return
    try:
        watcher.stdin.write(line.encode(errors="replace") + b"\n")
        watcher.stdin.flush()
    except OSError:  # it ended (killed by a person): the next arm starts another
        pass


def _stop() -> None:
    if _watcher is not None and _watcher.stdin is not None:
        try:
            _watcher.stdin.close()  # it ends on the closed pipe
        except OSError:
            pass
        # Reaped here: a Popen still running when the interpreter ends warns "subprocess N is still running", which
        # under `python -W error` (or PYTHONWARNINGS=error, -X dev) printed an "Exception ignored" traceback after a
        # run that had succeeded.
        try:
            _watcher.wait(timeout=5)
        except subprocess.TimeoutExpired:  # stopped (SIGSTOP) or starved: it has nothing left to watch
            _watcher.kill()
            _watcher.wait()
