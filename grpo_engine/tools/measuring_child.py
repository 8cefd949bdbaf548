"""A call in a child process that never outlives the parent waiting for it.

`grpo-engine bench` measures each step in a fresh process. With a ProcessPoolExecutor, a Ctrl-C sent to the bench
(`kill -INT`, a supervisor) was caught while the pool's exit waited for the child to finish its measurement: the
command hung for as long as that took (minutes at a long completion), without a line; a bench ended by SIGTERM or
SIGKILL left its child computing alone, holding its memory (a GPU's, on CUDA) until it finished. Here the wait is on a
pipe that any exception (KeyboardInterrupt included) leaves by killing the child, and the child asks the kernel to
kill it when its parent dies however it dies (Linux's PR_SET_PDEATHSIG; elsewhere only the first half holds).
"""

from __future__ import annotations

import os
import signal
import sys
from multiprocessing.context import BaseContext
from typing import Any, Callable, Optional

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """In the child: SIGKILL when the parent process ends; ends at once if it already has."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no libc to ask: the parent's kill on its way out still holds
            pass
    if os.getppid() != parent:  # it died before the kernel was asked
        os._exit(1)


def _run(send, parent: int, function: Callable[..., Any], args: tuple) -> None:
    die_with_parent(parent)
    try:
        outcome = ("returned", function(*args))
    except BaseException as exc:  # the parent raises it, as the pool did
        outcome = ("raised", exc)
    try:
        send.send(outcome)
    except Exception as exc:  # a result or exception that does not pickle
        send.send(("raised", RuntimeError(f"{outcome[1]!r} (could not be sent from the measuring process: {exc})")))
    send.close()


def call_in_child(context: BaseContext, function: Callable[..., Any], *args: Any) -> Optional[Any]:
    """function(*args) in a new process of `context` (fork or spawn; a spawned one needs `function` importable).
    Returns its result, raises what it raised, or returns None when the child died without either (killed: the
    out-of-memory killer, a signal; a crash in native code). However the wait ends, the child is gone after it."""
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_run, args=(send, os.getpid(), function, args), daemon=True)
    child.start()
    send.close()  # the child's copy is then the only writer: its death is the pipe's end
    try:
        outcome = receive.recv()
    except EOFError:
        return None
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        receive.close()
    kind, value = outcome
    if kind == "raised":
        raise value
    return value
