"""Ctrl-C / SIGTERM during training: finish the step in progress, save a checkpoint, stop with a hint.

A signal only sets a flag; the loop reads it at the step boundary, where the state is consistent and a
checkpoint resumes exactly. A second Ctrl-C stops at once (KeyboardInterrupt), for a step that takes too long.
"""

from __future__ import annotations

import logging
import signal
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
                    f"checkpoint (Ctrl-C again to stop at once, without one)")

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
    """Installs the SIGINT/SIGTERM handlers for the duration of training (main thread only; Python allows
    no other), and restores the previous ones."""
    request = StopRequest()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {sig: signal.signal(sig, request._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield request
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
