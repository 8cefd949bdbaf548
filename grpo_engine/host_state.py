"""The process-wide state train() runs under, set up the same in every host, and the caller's put back after.

train() is called from a notebook's cell or a script's loop, after the caller's own torch settings: before, a
default dtype of float64 trained other numbers than the terminal's run with the same seed, a default device of
`meta` or grad mode off (torch.set_grad_enabled(False), inference_mode, no_grad around the call) stopped deep in
torch, and after the run the caller's next cell found torch's thread count at run.num_threads and the random number
generators seeded by the run. The run's own settings decide what it computes (model.dtype, run.device,
run.num_threads, run.seed); the caller's switches are theirs again when train() returns or raises.
"""

from __future__ import annotations

import random
import threading
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Any, Callable, Iterator

import numpy as np
import torch

from .config import EngineConfig

_KEEP = object()  # the caller's value stays for the run (and is put back if the run changes it)


def _switches() -> list[tuple[Callable[[], Any], Callable[[Any], Any], Any]]:
    """(read, write, the run's value) of each process-wide torch switch the run needs set or changes itself. The
    others are the caller's to keep (anomaly detection, deterministic algorithms and matmul precision are how they
    ask a run to be checked or repeated); the reward fence puts back what a reward function changes."""
    return [
        (torch.is_grad_enabled, torch.set_grad_enabled, True),
        (torch.get_default_dtype, torch.set_default_dtype, torch.float32),  # what is made without naming a dtype
        # read as the CPU when none is set, and the CPU written as none (the run's device is run.device)
        (torch.get_default_device, _set_default_device, torch.device("cpu")),
        (torch.get_num_threads, torch.set_num_threads, _KEEP),  # run.num_threads sets it
        *((partial(torch.is_autocast_enabled, device), partial(torch.set_autocast_enabled, device), False)
          for device in ("cpu", "cuda")),
    ]


def _set_default_device(device: torch.device) -> None:
    torch.set_default_device(None if device == torch.device("cpu") else device)


@contextmanager
def run_process_state() -> Iterator[None]:
    """The body under the run's switches (_switches), outside inference mode; the switches and the random number
    generators (Python's, NumPy's global, torch's CPU and initialised CUDA ones) as the caller had them after."""
    saved = [(read, write, run, read()) for read, write, run in _switches()]
    python_rng, numpy_rng = random.getstate(), np.random.get_state()
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=cuda))
        stack.enter_context(torch.inference_mode(False))
        try:
            for read, write, run, value in saved:
                if run is not _KEEP and value != run:
                    write(run)
            yield
        finally:
            for read, write, run, value in saved:
                if read() != value:  # only what changed: setting a default device, even the same, adds a torch mode
                    write(value)
            random.setstate(python_rng)
            np.random.set_state(numpy_rng)


def off_main_thread_note(config: EngineConfig) -> str | None:
    """What a run in another thread than the main one goes without (Python lets only the main thread handle
    signals): the reward time limit (a SIGUSR1 to the main thread) and the checkpoint a stop signal saves. Said
    where a setting asks for them; before, a notebook's worker thread trained without them in silence."""
    if threading.current_thread() is threading.main_thread():
        return None
    lost = [f"rewards.timeout_seconds ({config.rewards.timeout_seconds:g} s) is not enforced"
            if config.rewards.timeout_seconds is not None else "",
            "a stop signal (Ctrl-C) does not save a checkpoint at the step boundary"
            if config.run.save_on_interrupt else ""]
    lost = [item for item in lost if item]
    if not lost:
        return None
    return (f"warning: train() runs in thread {threading.current_thread().name!r}, not the main thread, where "
            f"alone Python handles signals: {' and '.join(lost)}; call it from the main thread for them")
