"""Ctrl-C / SIGTERM / SIGHUP during training: finish the step in progress, save a checkpoint, stop with a hint.

A signal only sets a flag; the loop reads it at the step boundary, where the state is consistent and a
checkpoint resumes exactly. A second Ctrl-C stops at once (KeyboardInterrupt), for a step that takes too long.

SIGHUP is what a run started from a terminal gets when the terminal goes (an ssh connection dropped, the window
closed): by default it ended the process at once, the steps since the last checkpoint lost, without a word. It
stops at the step boundary with a checkpoint, like SIGTERM; what was written to the terminal that is gone goes to
/dev/null from then on, and a write that found it gone before the signal was handled (EIO) is dropped
(outlive_the_terminal), so that the progress bar cannot stop the step before it is saved. A SIGHUP ignored when training starts (nohup) stays ignored.

Every other signal whose default action ends the process does the same (stop_signals): SIGUSR1 / SIGUSR2 (what
SLURM's --signal, SGE's soft limits and LSF send ahead of ending a job), SIGXCPU (the CPU-time limit is near:
cpu_time_limit.py), SIGALRM, SIGPWR, the real-time signals. Each ended the process at once, the steps since the
last checkpoint lost, with not a line (measured: 7 of 9 such signals). Signals that report the process's own fault
(SIGSEGV, SIGABRT, ...) or ask for a core dump (SIGQUIT) keep their default, and so does one already ignored or
handled when training starts: a handler of a library's or the caller's stays theirs.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

from ..standard_streams import StreamGuard
from .cpu_time_limit import warned_before_the_cpu_limit

_log = logging.getLogger(__name__)  # grpo_engine/messages.py: how the CLI shows it

if TYPE_CHECKING:
    from accelerate import Accelerator


class TrainingInterrupted(Exception):
    """Raised at a step boundary after a stop signal; the CLI turns it into one line and exit status 130."""

    exit_status = 130

    def __init__(self, signal_name: str, step: int, checkpoint: Path) -> None:
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        super().__init__(f"{signal_name}: stopped after step {step}, checkpoint saved to {checkpoint}")


class RolloutServerLost(TrainingInterrupted):
    """A rollout server stopped answering for rollout.server.timeout_s: the run stopped with a checkpoint."""

    exit_status = 1


class StopRequest:
    def __init__(self) -> None:
        self.signal_name: Optional[str] = None

    def _handle(self, signum: int, frame) -> None:
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: the user will not wait for the step to end
        if self.signal_name is not None and self.signal_name == signal_name(signum):
            return  # SIGXCPU comes again every CPU second past the limit: said once
        self.signal_name = signal_name(signum)
        why = _WHY.get(self.signal_name, "")
        _log.warning(f"\ngrpo-engine: {self.signal_name} received{why}: stopping after the current step and saving "
                    f"a checkpoint (Ctrl-C again to stop at once, without one)")  # a failed write is the handler's
        if signum == getattr(signal, "SIGHUP", None):
            _leave_hung_up_terminal()

    def requested(self, accelerator: Accelerator) -> bool:
        """Whether any process got a signal: all processes must stop (and save) at the same step."""
        local = self.signal_name is not None
        if accelerator.num_processes == 1:
            return local
        import torch  # not at the top: the CLI imports this module before it knows that anything will run

        flag = torch.tensor([1.0 if local else 0.0], device=accelerator.device)
        return accelerator.reduce(flag, reduction="sum").item() > 0


# What a signal that is not a person's stop means, said with it.
_WHY = {"SIGXCPU": " (the CPU-time limit, ulimit -t, is near)"}

# Signals whose default action ends the process but that report a fault of the process itself (a crash, an abort, a
# debugger's trap) or ask for a core dump on purpose (SIGQUIT, Ctrl-\), and signals whose default does not end it
# (ignored, or stop / continue) or that no handler can catch. Every other signal a run may get stops it with a
# checkpoint: the set is what is left of the platform's signals, so a signal nobody listed is not missed.
_LEFT_ALONE = ("SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGIOT", "SIGEMT", "SIGBUS", "SIGFPE", "SIGSEGV", "SIGSYS",
               "SIGCHLD", "SIGCLD", "SIGCONT", "SIGURG", "SIGWINCH", "SIGINFO", "SIGTSTP", "SIGTTIN", "SIGTTOU",
               "SIGSTOP", "SIGKILL")


def signal_name(signum: int) -> str:
    """SIGTERM, SIGRTMIN+3 (the real-time signals between SIGRTMIN and SIGRTMAX have no names of their own)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        low = getattr(signal, "SIGRTMIN", None)
        return f"SIGRTMIN+{signum - low}" if low is not None and signum > low else f"signal {signum}"


def stop_signals() -> list[int]:
    """The signals training stops on at the step boundary: SIGINT and SIGTERM always, and every other one whose
    default action would end the process while its action is still that default (one ignored, such as SIGHUP under
    nohup or Python's SIGPIPE, or one a library or the caller handles, stays as it is)."""
    skipped = {getattr(signal, name) for name in _LEFT_ALONE if hasattr(signal, name)}
    chosen = [signal.SIGINT, signal.SIGTERM]
    for signum in sorted(signal.valid_signals()):
        if signum in skipped or signum in chosen:
            continue
        try:
            if signal.getsignal(signum) is signal.SIG_DFL:
                chosen.append(signum)
        except (OSError, ValueError):  # reserved by the platform
            continue
    return chosen


@contextmanager
def stop_at_step_boundary(enabled: bool) -> Iterator[StopRequest]:
    """Installs the stop handlers (stop_signals) for the duration of training (main thread only; Python allows no
    other), with the CPU-time limit's warning ahead of its kill, and restores the previous ones."""
    request = StopRequest()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {}
    for sig in stop_signals():
        try:
            previous[sig] = signal.signal(sig, request._handle)
        except (OSError, ValueError):  # one the platform will not let Python handle
            continue
    # A handler is not enough for a signal the process was started with blocked (a parent's signal mask is
    # inherited): `timeout`'s or a scheduler's SIGTERM then stayed pending, the run trained on until the SIGKILL
    # that follows, and lost its steps since the last checkpoint. Unblocked here, restored after.
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, previous) if hasattr(signal, "pthread_sigmask") else None
    try:
        with warned_before_the_cpu_limit():
            yield request
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _leave_hung_up_terminal() -> None:
    """Points stdout and stderr that are a terminal at /dev/null (what nohup does before the hangup): after SIGHUP the
    terminal may be gone, and a write to it fails (EIO), which would stop the step in progress unsaved. Output
    redirected to a file or a pipe stays where it is: a supervisor's `kill -HUP` leaves its log whole."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        for fd in (1, 2):
            try:
                if os.isatty(fd):
                    os.dup2(null, fd)
            except OSError:
                pass
    finally:
        os.close(null)


class _OutlivesItsTerminal(StreamGuard):
    """A terminal stream (sys.stdout, sys.stderr) whose writes, once its terminal has hung up (EIO), are dropped: the
    hangup's SIGHUP reaches Python's handler only at the next bytecode, and a progress bar's write in between failed
    with EIO, stopping the step in progress unsaved. Everything else is the stream's own."""

    def _guarded(self, operation, *args):
        try:
            return operation(*args)
        except OSError as exc:
            if exc.errno not in (errno.EIO, errno.ENXIO):
                raise
            _leave_hung_up_terminal()  # the terminal is gone: from now on the bytes go to /dev/null
            return None


def outlive_the_terminal() -> None:
    """Wraps sys.stdout and sys.stderr that are a terminal in _OutlivesItsTerminal (the CLI does it first)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            is_terminal = stream is not None and not isinstance(stream, _OutlivesItsTerminal) and stream.isatty()
        except (OSError, ValueError, AttributeError):
            is_terminal = False
        if is_terminal:
            setattr(sys, name, _OutlivesItsTerminal(stream))
