"""Ctrl-C / SIGTERM / SIGHUP during training: finish the step in progress, save a checkpoint, stop with a hint.

A signal only sets a flag; the loop reads it at the step boundary, where the state is consistent and a
checkpoint resumes exactly. A second Ctrl-C stops at once (KeyboardInterrupt), for a step that takes too long.

SIGHUP is what a run started from a terminal gets when the terminal goes (an ssh connection dropped, the window
closed): by default it ended the process at once, the steps since the last checkpoint lost, without a word. It
stops at the step boundary with a checkpoint, like SIGTERM; what was written to the terminal that is gone goes to
/dev/null from then on, and a write that found it gone before the signal was handled (EIO) is dropped
(outlive_the_terminal), so that the progress bar cannot stop the step before it is saved. A SIGHUP ignored when training starts (nohup) stays ignored.
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
        self.signal_name = signal.Signals(signum).name
        _log.warning(f"\ngrpo-engine: {self.signal_name} received: stopping after the current step and saving a "
                    f"checkpoint (Ctrl-C again to stop at once, without one)")  # a failed write is the handler's
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


@contextmanager
def stop_at_step_boundary(enabled: bool) -> Iterator[StopRequest]:
    """Installs the SIGINT/SIGTERM/SIGHUP handlers for the duration of training (main thread only; Python allows
    no other), and restores the previous ones."""
    request = StopRequest()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield request
        return
    signals = [signal.SIGINT, signal.SIGTERM]
    hangup = getattr(signal, "SIGHUP", None)  # none on Windows
    if hangup is not None and signal.getsignal(hangup) is signal.SIG_DFL:  # SIG_IGN: started under nohup
        signals.append(hangup)
    previous = {sig: signal.signal(sig, request._handle) for sig in signals}
    try:
        yield request
    finally:
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


class _OutlivesItsTerminal:
    """A terminal stream (sys.stdout, sys.stderr) whose writes, once its terminal has hung up (EIO), are dropped: the
    hangup's SIGHUP reaches Python's handler only at the next bytecode, and a progress bar's write in between failed
    with EIO, stopping the step in progress unsaved. Everything else is the stream's own."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def _guarded(self, operation, *args):
        try:
            return operation(*args)
        except OSError as exc:
            if exc.errno not in (errno.EIO, errno.ENXIO):
                raise
            _leave_hung_up_terminal()  # the terminal is gone: from now on the bytes go to /dev/null
            return None

    def write(self, text: str):
        result = self._guarded(self._stream.write, text)
        return len(text) if result is None else result

    def flush(self) -> None:
        self._guarded(self._stream.flush)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


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
