"""What a reward function, or the import of its module, raises that is not an Exception: read at the reward boundary.

`except Exception` lets the other BaseExceptions through, and each reached the CLI as something else (measured):

- `sys.exit()` at a reward module's import (a file that is also a script): `sys.exit(0)` ended `grpo-engine train`
  with status 0 and not a line, as if it had succeeded; argparse's `parse_args()` at import read the engine's command
  line and ended the run with the usage line of a program called `__main__.py`;
- a KeyboardInterrupt the function raised itself (no Ctrl-C came) read as the user's Ctrl-C: "interrupted";
- `asyncio.CancelledError`, `GeneratorExit`, a user's own BaseException subclass: a traceback.

Each is now one RewardFunctionError naming the function or module. A Ctrl-C that did come while the user's code ran
(a SIGINT this process received: `interrupt_watch` sees it) stays the user's, passed on as it was.
"""

from __future__ import annotations

import signal
import threading
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional


@dataclass
class InterruptWatch:
    seen: bool = False  # whether a SIGINT arrived while the watched body ran


@contextmanager
def interrupt_watch() -> Iterator[InterruptWatch]:
    """The body, with a SIGINT noted before the handler in place (the engine's or Python's) acts on it as before."""
    watch = InterruptWatch()
    if threading.current_thread() is not threading.main_thread():
        yield watch  # no handler can be set here, and no signal arrives here: a KeyboardInterrupt is the code's own
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):  # SIG_IGN, SIG_DFL or unknown (set from C): left as it is, so a Ctrl-C acts as before
        watch.seen = True  # unknown whether one came: any KeyboardInterrupt is taken as the user's, as before
        yield watch
        return

    def noted(signum: int, frame: Any) -> None:
        watch.seen = True
        previous(signum, frame)

    signal.signal(signal.SIGINT, noted)
    try:
        yield watch
    finally:
        if signal.getsignal(signal.SIGINT) is noted:  # the fence puts back a handler the body set, inside this
            signal.signal(signal.SIGINT, previous)


def is_users_interrupt(exc: BaseException, watch: InterruptWatch) -> bool:
    """A KeyboardInterrupt that a Ctrl-C (SIGINT) caused: the person at the terminal stopping the run."""
    return isinstance(exc, KeyboardInterrupt) and watch.seen


def exit_description(exc: BaseException) -> Optional[str]:
    """What a non-Exception raised by user code did, in words; None for an ordinary Exception."""
    if isinstance(exc, Exception):
        return None
    if isinstance(exc, SystemExit):
        frames = traceback.extract_tb(exc.__traceback__)
        argparse = any(frame.filename.endswith("argparse.py") for frame in frames)
        hint = (" (argparse's parse_args() read the engine's command line: parse a script's arguments under "
                "`if __name__ == '__main__':`)" if argparse else "")
        return f"called sys.exit({exc.code!r}){hint}: reward code may not end the run"
    if isinstance(exc, KeyboardInterrupt):
        return "raised KeyboardInterrupt itself (no Ctrl-C came); raise an Exception to stop the run"
    text = f": {exc}" if str(exc) else ""
    return (f"raised {type(exc).__name__}{text}, a BaseException that is not an Exception; raise an Exception, or "
            f"catch it inside the reward")
