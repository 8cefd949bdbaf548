"""A time limit on one call of a reward function (rewards.timeout_seconds).

A reward function is the user's code: it may loop forever or wait on a server that never answers, and the run
would hang with it. A timer thread sends the main thread SIGUSR1 when the limit passes; the handler raises
`RewardTimeout` there, which also breaks a `time.sleep` or a blocking read (the signal interrupts the system
call). It derives from BaseException, so a function's own `except Exception:` cannot swallow it. Not SIGALRM:
libraries a reward function calls (math-verify) arm and cancel that alarm for their own time limits.

A function that never sees the exception (it catches BaseException in a loop, or is stuck inside C code, such as
a regular expression backtracking for hours, which holds the GIL: no thread here can run) is given STOP_GRACE_S
more; then a watchdog process (stop_watchdog.py) ends this one with one line naming it: a run that waits for ever
saves nothing either, and its last checkpoint is on disk.

Limits: the main thread only (Python delivers signals there), and POSIX only (no pthread_kill on Windows).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator, Optional

from . import stop_watchdog


# How long a function told to stop may take to stop before the process ends.
STOP_GRACE_S = 10.0


class RewardTimeout(BaseException):
    """A reward-function call ran past its time limit."""


@contextmanager
def time_limit(seconds: Optional[float], what: str = "a reward function") -> Iterator[None]:
    """Raise RewardTimeout in the body once `seconds` have passed (None: no limit); end the process, naming `what`,
    when the body has not stopped STOP_GRACE_S later."""
    main = threading.main_thread()
    if seconds is None or not hasattr(signal, "pthread_kill") or threading.current_thread() is not main:
        yield
        return
    expired = threading.Event()
    active = True

    def on_signal(signum, frame) -> None:
        if active and expired.is_set():
            raise RewardTimeout
        # Another's SIGUSR1 (a scheduler's warning before it ends the job) means what it meant before the call: a
        # stop at the step boundary while training (interrupt.stop_signals); swallowed here, the run went on to be
        # killed unsaved.
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    def expire() -> None:
        expired.set()
        signal.pthread_kill(main.ident, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, on_signal)
    stop_watchdog.arm(seconds + STOP_GRACE_S,
                      f"grpo-engine: {what} did not return within {seconds:g} s (rewards.timeout_seconds) and did not "
                      f"stop {STOP_GRACE_S:g} s after being told to (it catches BaseException, or is stuck in C code "
                      f"such as a regular expression): the process was ended; what the run saved stays as it was (a "
                      f"training run continues from its last checkpoint with --resume)")
    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        active = False
        stop_watchdog.disarm()
        timer.cancel()
        timer.join()  # a signal already on its way lands on `on_signal`, which now ignores it
        signal.signal(signal.SIGUSR1, previous)

