"""A time limit on one call of a reward function (rewards.timeout_seconds).

A reward function is the user's code: it may loop forever or wait on a server that never answers, and the run
would hang with it. A timer thread sends the main thread SIGUSR1 when the limit passes; the handler raises
`RewardTimeout` there, which also breaks a `time.sleep` or a blocking read (the signal interrupts the system
call). It derives from BaseException, so a function's own `except Exception:` cannot swallow it. Not SIGALRM:
libraries a reward function calls (math-verify) arm and cancel that alarm for their own time limits.

Limits: the main thread only (Python delivers signals there), and POSIX only (no pthread_kill on Windows); a
function stuck inside C code that never returns to Python is stopped only at its return (or by Ctrl-C twice).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator, Optional


class RewardTimeout(BaseException):
    """A reward-function call ran past its time limit."""


@contextmanager
def time_limit(seconds: Optional[float]) -> Iterator[None]:
    """Raise RewardTimeout in the body once `seconds` have passed (None: no limit)."""
    main = threading.main_thread()
    if seconds is None or not hasattr(signal, "pthread_kill") or threading.current_thread() is not main:
        yield
        return
    expired = threading.Event()
    active = True

    def on_signal(signum, frame) -> None:
        if active and expired.is_set():
            raise RewardTimeout

    def expire() -> None:
        expired.set()
        signal.pthread_kill(main.ident, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, on_signal)
    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        active = False
        timer.cancel()
        timer.join()  # a signal already on its way lands on `on_signal`, which now ignores it
        signal.signal(signal.SIGUSR1, previous)
