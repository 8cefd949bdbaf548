"""The fence around one call of a user's reward function: what it can change of the process is put back.

A reward function is the user's code and runs inside the training process. Whatever it does to the state the
engine relies on is undone when it returns (or raises), so the run goes on as if it had not been called:

- its arguments are deep copies (the dataset's rows, the prompts, the completions and their ids): a function
  that appends to a list field changes nothing that a later step, another function or a resumed run sees;
- the random number generators (Python's `random`, NumPy's global one, torch's CPU and initialised CUDA
  generators) are restored: a function that draws numbers, or seeds them, leaves the training trajectory as it
  was, so a run scores and trains the same with or without that draw;
- the working directory, the environment variables, the umask and the signal handlers;
- torch's global switches: grad mode, default dtype, default device, thread counts, deterministic-algorithms
  mode, anomaly detection, float32 matmul precision and the TF32 / cuDNN flags;
- `sys.stdout` / `sys.stderr` / `sys.stdin`, the warnings filters, the recursion limit and logging's global
  `disable` level.

docs/engine.md ("What the engine guarantees") keeps this list for users. What is not fenced: a function can
still end the process from C (`os._exit`), block in C code past its time limit, or change objects it reaches by
import (a module's globals, including the engine's); those are the user's to keep.
"""

from __future__ import annotations

import copy
import logging
import os
import random
import signal
import sys
import threading
import warnings
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator

import numpy as np
import torch

# Signals whose handlers cannot be read or set (or that Python reserves).
_FIXED_SIGNALS = {getattr(signal, name) for name in ("SIGKILL", "SIGSTOP") if hasattr(signal, name)}


def fenced_arguments(**arguments: Any) -> dict[str, Any]:
    """Deep copies of a reward call's arguments: nothing the function changes in them reaches the engine."""
    return copy.deepcopy(arguments)


def _signal_handlers() -> dict[int, Any]:
    handlers = {}
    for signum in signal.valid_signals():
        if signum in _FIXED_SIGNALS:
            continue
        try:
            handlers[signum] = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
    return handlers


def _restore_signal_handlers(saved: dict[int, Any]) -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # handlers can be set from the main thread only, so a call elsewhere could not change them
    for signum, handler in saved.items():
        if handler is not None and signal.getsignal(signum) is not handler:
            try:
                signal.signal(signum, handler)
            except (OSError, ValueError):
                pass


def _restore_environment(saved: dict[str, str]) -> None:
    for key in set(os.environ) - set(saved):
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _torch_switches() -> list[tuple[Callable[[], Any], Callable[[Any], Any]]]:
    """(read, write) pairs of torch's process-wide settings a function could flip."""
    switches = [
        (torch.is_grad_enabled, torch.set_grad_enabled),
        (torch.get_default_dtype, torch.set_default_dtype),
        (torch.get_num_threads, torch.set_num_threads),
        (torch.are_deterministic_algorithms_enabled, lambda on: torch.use_deterministic_algorithms(on)),
        (torch.is_deterministic_algorithms_warn_only_enabled,
         lambda warn: torch.use_deterministic_algorithms(torch.are_deterministic_algorithms_enabled(),
                                                         warn_only=warn)),
        (torch.is_anomaly_enabled, torch.set_anomaly_enabled),
        (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        (lambda: torch.backends.cuda.matmul.allow_tf32, lambda v: setattr(torch.backends.cuda.matmul, "allow_tf32", v)),
        (lambda: torch.backends.cudnn.allow_tf32, lambda v: setattr(torch.backends.cudnn, "allow_tf32", v)),
        (lambda: torch.backends.cudnn.benchmark, lambda v: setattr(torch.backends.cudnn, "benchmark", v)),
        (lambda: torch.backends.cudnn.deterministic, lambda v: setattr(torch.backends.cudnn, "deterministic", v)),
        (torch.get_default_device, torch.set_default_device),
    ]
    return switches


@contextmanager
def _torch_state() -> Iterator[None]:
    saved = [(read, write, read()) for read, write in _torch_switches()]
    interop = torch.get_num_interop_threads()
    try:
        yield
    finally:
        for read, write, value in saved:
            if read() != value:  # only what changed: setting a default device, even the same, adds a torch mode
                write(value)
        if torch.get_num_interop_threads() != interop:  # settable once per process: a change cannot be undone
            warnings.warn("a reward function changed torch's inter-op thread count", RuntimeWarning, stacklevel=1)


@contextmanager
def _random_state() -> Iterator[None]:
    python_state = random.getstate()
    numpy_state = np.random.get_state()
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda):
        try:
            yield
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)


@contextmanager
def _process_state() -> Iterator[None]:
    cwd = os.getcwd()
    environment = dict(os.environ)
    umask = os.umask(0o022)
    os.umask(umask)
    handlers = _signal_handlers()
    streams = (sys.stdout, sys.stderr, sys.stdin)
    recursion_limit = sys.getrecursionlimit()
    logging_disabled = logging.root.manager.disable
    try:
        yield
    finally:
        os.chdir(cwd)
        _restore_environment(environment)
        os.umask(umask)
        _restore_signal_handlers(handlers)
        sys.stdout, sys.stderr, sys.stdin = streams
        sys.setrecursionlimit(recursion_limit)
        logging.disable(logging_disabled)


@contextmanager
def reward_fence() -> Iterator[None]:
    """Run the body (one reward-function call) with the process state it may change restored afterwards."""
    with ExitStack() as stack:
        stack.enter_context(_process_state())
        stack.enter_context(warnings.catch_warnings())
        stack.enter_context(_random_state())
        stack.enter_context(_torch_state())
        yield
