"""The fence around one call of a user's reward function: what it can change of the process is put back.

A reward function is the user's code and runs inside the training process. Whatever it does to the state the
engine relies on is undone when it returns (or raises), so the run goes on as if it had not been called:

- its arguments are deep copies (the dataset's rows, the prompts, the completions and their ids): a function
  that appends to a list field changes nothing that a later step, another function or a resumed run sees;
- the random number generators (Python's `random`, NumPy's global one, torch's CPU and initialised CUDA
  generators) are restored: a function that draws numbers, or seeds them, leaves the training trajectory as it
  was, so a run scores and trains the same with or without that draw;
- the working directory, the environment variables, the umask, the signal handlers and the interval timers (a
  timer it arms, `signal.alarm` or `setitimer`, is disarmed: its signal came later, mid-training, and stopped the
  run as a SIGALRM from outside would, naming no function);
- torch's global switches: grad mode, default dtype, default device, thread counts, deterministic-algorithms
  mode, anomaly detection, float32 matmul precision, the TF32 / cuDNN flags, autocast (on, its dtype, its cache)
  and torch.nn.Module's global hooks (register_module_forward_hook and its kin);
- `sys.stdout` / `sys.stderr` / `sys.stdin` (and what `reconfigure` changes of them), the warnings filters, the
  recursion limit and logging's global `disable` level;
- the interpreter's and NumPy's switches (_interpreter_switches): flush-denormal mode, NumPy's error handling, the
  garbage collector (on, thresholds), trace / profile functions, switch interval, integer string limit, the exception
  and unraisable hooks, the default socket timeout, the new threads' stack size, the C locale;
- what reward_fence_process.py keeps: resource limits, the signal mask, descriptors 0-2, the functions of the modules
  the engine calls, sys.modules entries, the root and engine loggers; and a forked child returning here is ended.

The same fence stands around the import of a reward module (`module:function`): a module that switches grad mode
off at import is put back like a call that does. Whatever the fence puts back is said once, in one line naming the
function (or module) and what it changed, so a function that relies on its change learns that it did not hold.
What the fence cannot put back is named the same way: a thread it leaves running that is not a daemon (which
would keep the process alive after the run ended: the CLI ends the process without waiting for such threads,
naming them), torch's inter-op thread count (settable once per process).

docs/engine.md ("What the engine guarantees") keeps this list for users. What is not fenced: a function can
still end the process from C (`os._exit`), block in C code past its time limit, or change the data of objects it
reaches by import (a module's globals, including the engine's); those are the user's to keep.
"""

from __future__ import annotations

import _signal
import copy
import gc
import io
import locale
import logging
import os
import random
import signal
import socket
import sys
import threading
import warnings
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Any, Callable, Iterator

import numpy as np
import torch

from .reward_fence_process import process_tables

_log = logging.getLogger(__name__)  # grpo_engine/messages.py: how the CLI shows it

# Signals whose handlers cannot be read or set (or that Python reserves).
_FIXED_SIGNALS = {getattr(signal, name) for name in ("SIGKILL", "SIGSTOP") if hasattr(signal, name)}


def fenced_arguments(**arguments: Any) -> dict[str, Any]:
    """Deep copies of a reward call's arguments: nothing the function changes in them reaches the engine."""
    return copy.deepcopy(arguments)


# The signals whose handlers are read: every one but those. Read before and after every call through _signal's
# getsignal, signal.getsignal without its conversion of each handler to an enum (most of this part's cost).
_SIGNALS = tuple(int(signum) for signum in signal.valid_signals() if signum not in _FIXED_SIGNALS)


def _signal_handlers() -> dict[int, Any]:
    handlers = {}
    for signum in _SIGNALS:
        try:
            handlers[signum] = _signal.getsignal(signum)
        except (OSError, ValueError):
            continue
    return handlers


def _restore_signal_handlers(saved: dict[int, Any]) -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # handlers can be set from the main thread only, so a call elsewhere could not change them
    for signum, handler in saved.items():
        if handler is not None and _signal.getsignal(signum) != handler:
            try:
                signal.signal(signum, handler)
            except (OSError, ValueError):
                pass


# The process's interval timers (signal.alarm is ITIMER_REAL's): each ends in a signal whose default ends the run.
_TIMERS = {name: getattr(signal, name) for name in ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF")
           if hasattr(signal, name)}


def _armed_timers() -> set[str]:
    return {name for name, which in _TIMERS.items() if signal.getitimer(which)[0] > 0}


def _disarm_new_timers(armed_before: set[str]) -> list[str]:
    """Disarms every interval timer armed since `armed_before` was read (one armed before is left as it runs: its
    remaining time cannot be put back exactly, and it is not the call's); their names."""
    new = sorted(_armed_timers() - armed_before)
    for name in new:
        signal.setitimer(_TIMERS[name], 0)
    return new


def _restore_environment(saved: dict[str, str]) -> None:
    for key in set(os.environ) - set(saved):
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _torch_switches() -> list[tuple[str, Callable[[], Any], Callable[[Any], Any]]]:
    """(name, read, write) of torch's process-wide settings a function could flip."""
    switches = [
        ("grad mode", torch.is_grad_enabled, torch.set_grad_enabled),
        ("default dtype", torch.get_default_dtype, torch.set_default_dtype),
        ("thread count", torch.get_num_threads, torch.set_num_threads),
        ("deterministic-algorithms mode", torch.are_deterministic_algorithms_enabled,
         lambda on: torch.use_deterministic_algorithms(on)),
        ("deterministic-algorithms warn-only flag", torch.is_deterministic_algorithms_warn_only_enabled,
         lambda warn: torch.use_deterministic_algorithms(torch.are_deterministic_algorithms_enabled(),
                                                         warn_only=warn)),
        ("anomaly detection", torch.is_anomaly_enabled, torch.set_anomaly_enabled),
        ("float32 matmul precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        ("CUDA matmul TF32 flag", lambda: torch.backends.cuda.matmul.allow_tf32,
         lambda v: setattr(torch.backends.cuda.matmul, "allow_tf32", v)),
        ("cuDNN TF32 flag", lambda: torch.backends.cudnn.allow_tf32,
         lambda v: setattr(torch.backends.cudnn, "allow_tf32", v)),
        ("cuDNN benchmark flag", lambda: torch.backends.cudnn.benchmark,
         lambda v: setattr(torch.backends.cudnn, "benchmark", v)),
        ("cuDNN deterministic flag", lambda: torch.backends.cudnn.deterministic,
         lambda v: setattr(torch.backends.cudnn, "deterministic", v)),
        ("default device", torch.get_default_device, torch.set_default_device),
        ("autocast cache flag", torch.is_autocast_cache_enabled, torch.set_autocast_cache_enabled),
        ("global module hooks", _global_module_hooks, _set_global_module_hooks),
    ]
    for device in _AUTOCAST_DEVICES:  # autocast left on would run the training forwards in its dtype
        switches += [(f"{device} autocast", partial(torch.is_autocast_enabled, device),
                      partial(torch.set_autocast_enabled, device)),
                     (f"{device} autocast dtype", partial(torch.get_autocast_dtype, device),
                      partial(torch.set_autocast_dtype, device))]
    return switches


_AUTOCAST_DEVICES = ("cpu", "cuda")
# torch.nn.Module's process-wide hooks (register_module_forward_hook and its kin), which every module of every
# model runs: one a function leaves behind changes what the policy computes (a hook returning NaN made every later
# forward NaN). Read by name: the set differs a little between torch releases.
_HOOK_TABLES = tuple(name for name in dir(torch.nn.modules.module)
                     if name.startswith("_global_") and isinstance(getattr(torch.nn.modules.module, name), dict))


def _global_module_hooks() -> tuple:
    module = torch.nn.modules.module
    return (module._global_is_full_backward_hook,
            *(tuple(getattr(module, name).items()) for name in _HOOK_TABLES))


def _set_global_module_hooks(saved: tuple) -> None:
    module = torch.nn.modules.module
    module._global_is_full_backward_hook = saved[0]
    for name, items in zip(_HOOK_TABLES, saved[1:]):
        table = getattr(module, name)
        table.clear()
        table.update(items)


def _flushes_denormals() -> bool:
    """torch.set_flush_denormal has no getter: a float32 subnormal times 1 is 0 exactly when it is on."""
    return float(torch.tensor(1e-39, dtype=torch.float32) * 1.0) == 0.0


def _interpreter_switches() -> list[tuple[str, Callable[[], Any], Callable[[Any], Any]]]:
    """(name, read, write) of the interpreter's and NumPy's process-wide settings a function could flip: each
    changes what the engine computes (denormals flushed to 0, NumPy's errors raised), how fast (a trace function
    on every line, the garbage collector off) or what it reports (the exception hooks that print the one-line
    error)."""
    return [
        ("torch's flush-denormal mode", _flushes_denormals, torch.set_flush_denormal),
        ("NumPy's floating-point error handling", np.geterr, lambda state: np.seterr(**state)),
        ("the garbage collector's state", gc.isenabled, lambda on: gc.enable() if on else gc.disable()),
        ("the trace function (sys.settrace)", sys.gettrace, sys.settrace),
        ("the profile function (sys.setprofile)", sys.getprofile, sys.setprofile),
        ("the thread switch interval", sys.getswitchinterval, sys.setswitchinterval),
        ("the integer string conversion limit", sys.get_int_max_str_digits, sys.set_int_max_str_digits),
        ("sys.excepthook", lambda: sys.excepthook, lambda hook: setattr(sys, "excepthook", hook)),
        ("threading.excepthook", lambda: threading.excepthook, lambda hook: setattr(threading, "excepthook", hook)),
        ("sys.unraisablehook", lambda: sys.unraisablehook, lambda hook: setattr(sys, "unraisablehook", hook)),
        # A reward calling a web API sets it for its own requests: the engine's rollout server and rendezvous
        # connections then timed out after it.
        ("the default socket timeout", socket.getdefaulttimeout, socket.setdefaulttimeout),
        ("the garbage collector's thresholds", gc.get_threshold, lambda limits: gc.set_threshold(*limits)),
        ("the new threads' stack size", _stack_size, threading.stack_size),
        ("the C locale", _locale, lambda saved: locale.setlocale(locale.LC_ALL, saved)),
    ]


def _stack_size() -> int:
    """threading.stack_size() without an argument sets the size to 0 as it reads it: set back at once."""
    size = threading.stack_size()
    threading.stack_size(size)
    return size


def _locale() -> str:
    return locale.setlocale(locale.LC_ALL)  # a query: no second argument


@contextmanager
def _switches(changed: list[str], switches: list[tuple[str, Callable[[], Any], Callable[[Any], Any]]],
              owner: str = "") -> Iterator[None]:
    saved = [(name, read, write, read()) for name, read, write in switches]
    try:
        yield
    finally:
        for name, read, write, value in saved:
            now = read()
            if now != value:  # only what changed: setting a default device, even the same, adds a torch mode
                shown = f" ({value} -> {now})" if isinstance(value, (bool, int, float, str, torch.dtype)) else ""
                shown = shown if len(shown) <= 80 else ""  # a composite locale: the name of the setting says enough
                changed.append(f"changed {owner}{name}{shown}; the engine put it back")
                write(value)


@contextmanager
def _torch_state(changed: list[str]) -> Iterator[None]:
    interop = torch.get_num_interop_threads()
    try:
        with _switches(changed, _torch_switches(), "torch's "):
            yield
    finally:
        if torch.get_num_interop_threads() != interop:  # settable once per process: a change cannot be undone
            changed.append("changed torch's inter-op thread count, which cannot be set back (once per process)")


@contextmanager
def _random_state() -> Iterator[None]:
    """Drawing numbers is a reward's right (sampling, tie-breaking): put back without a word."""
    python_state = random.getstate()
    numpy_state = np.random.get_state()
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda):
        try:
            yield
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)


def _fileno(stream: Any) -> Any:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # a StringIO, a capture without a descriptor
        return None


def _reopened(stream: Any, fd: Any, changed: list[str]) -> Any:
    """`stream` itself, or, when the function closed it (sys.stdout.close()), a new one on the same file
    descriptor: Python's standard streams do not own descriptors 0-2, so those stay open, and every later print of
    the engine would otherwise fail on a closed file."""
    if not getattr(stream, "closed", False):
        return stream
    if not isinstance(fd, int):
        return stream  # not a stream on a descriptor: nothing to reopen it on
    try:
        os.fstat(fd)
    except OSError:
        return stream  # the descriptor itself was closed (os.close): nothing to reopen
    changed.append(f"closed the stream on file descriptor {fd}; the engine opened it again")
    return open(fd, "r" if fd == 0 else "w", buffering=-1 if fd == 0 else 1, closefd=False,
                encoding=getattr(stream, "encoding", None) or "utf-8", errors=getattr(stream, "errors", None))


def _stream_settings(stream: Any) -> Any:
    """What `reconfigure` changes in a standard stream (a TextIOWrapper): its encoding and error handler, which the CLI
    sets so that no character ends a print in UnicodeEncodeError, and its buffering; None for another stream."""
    if not isinstance(stream, io.TextIOWrapper) or stream.closed:
        return None
    return stream.encoding, stream.errors, stream.line_buffering, stream.write_through


def _restore_stream_settings(streams: tuple, before: tuple, saved: list, changed: list[str]) -> None:
    """Each stream still the one the call began with, reconfigured back (one replaced or reopened is another's)."""
    for name, stream, first, settings in zip(("stdout", "stderr", "stdin"), streams, before, saved):
        if stream is not first or settings is None or _stream_settings(stream) in (None, settings):
            continue
        encoding, errors, line_buffering, write_through = settings
        try:
            stream.reconfigure(encoding=encoding, errors=errors, line_buffering=line_buffering,
                               write_through=write_through)
        except (OSError, ValueError, io.UnsupportedOperation):  # stdin after a read cannot change its encoding
            continue
        changed.append(f"reconfigured sys.{name} (its encoding, error handler or buffering); the engine put it back")


@contextmanager
def _process_state(changed: list[str]) -> Iterator[None]:
    cwd = os.getcwd()
    environment = dict(os.environ)
    umask = os.umask(0o022)
    os.umask(umask)
    handlers = _signal_handlers()
    timers = _armed_timers()
    streams = (sys.stdout, sys.stderr, sys.stdin)
    fds = [_fileno(stream) for stream in streams]
    stream_settings = [_stream_settings(stream) for stream in streams]
    recursion_limit = sys.getrecursionlimit()
    logging_disabled = logging.root.manager.disable
    try:
        yield
    finally:
        if os.getcwd() != cwd:
            changed.append(f"changed the working directory (to {os.getcwd()}); the engine put it back")
        os.chdir(cwd)
        names = sorted(key for key in set(os.environ) | set(environment) if os.environ.get(key) != environment.get(key))
        if names:
            shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
            changed.append(f"changed the environment ({shown}); the engine put it back")
        _restore_environment(environment)
        if os.umask(umask) != umask:
            changed.append("changed the umask; the engine put it back")
        if _signal_handlers() != handlers:
            changed.append("changed signal handlers; the engine put it back")
        _restore_signal_handlers(handlers)
        armed = _disarm_new_timers(timers)
        if armed:
            changed.append(f"armed an interval timer ({', '.join(armed)}: signal.alarm / setitimer); the engine "
                           f"disarmed it")
        if (sys.stdout, sys.stderr, sys.stdin) != streams:
            changed.append("changed sys.stdout / sys.stderr / sys.stdin; the engine put it back")
        sys.stdout, sys.stderr, sys.stdin = (_reopened(stream, fd, changed) for stream, fd in zip(streams, fds))
        _restore_stream_settings((sys.stdout, sys.stderr, sys.stdin), streams, stream_settings, changed)
        if sys.getrecursionlimit() != recursion_limit:
            changed.append("changed the recursion limit; the engine put it back")
        sys.setrecursionlimit(recursion_limit)
        if logging.root.manager.disable != logging_disabled:
            changed.append("changed logging's disable level; the engine put it back")
            logging.disable(logging_disabled)  # only then: it clears every logger's cache (hundreds, transformers')


# Threads a fenced call or import left running that are not daemons, each with who started it: the CLI ends the
# process without waiting for them (threading would join them at exit: a reward's loop would keep the finished
# run alive).
LEFT_RUNNING: dict[threading.Thread, str] = {}
_SAID: set[str] = set()


@contextmanager
def _threads(changed: list[str], owner: str) -> Iterator[None]:
    before = set(threading.enumerate())
    try:
        yield
    finally:
        left = [t for t in threading.enumerate() if t not in before and t.is_alive() and not t.daemon]
        for thread in left:
            LEFT_RUNNING[thread] = owner
        if left:
            changed.append(f"left {len(left)} thread{'s' if len(left) > 1 else ''} running that "
                           f"{'are not daemons' if len(left) > 1 else 'is not a daemon'} "
                           f"({', '.join(repr(t.name) for t in left[:3])}), which the run will not wait for at exit")


def threads_left_running() -> list[str]:
    """'name' (by whom) of each non-daemon thread a reward started that is still alive."""
    return [f"{thread.name!r} (started by {owner})" for thread, owner in LEFT_RUNNING.items() if thread.is_alive()]


def _say(owner: str, changed: list[str]) -> None:
    """One line per reward function (or module) and kind of change, the first time it happens."""
    for change in changed:
        key = f"{owner}\0{change.split(' (')[0]}"
        if key not in _SAID:
            _SAID.add(key)
            _log.warning(f"warning: {owner} {change}")


@contextmanager
def reward_fence(owner: str = "a reward function") -> Iterator[None]:
    """Run the body (one reward-function call, or the import of a reward module; `owner` names it in a warning)
    with the process state it may change restored afterwards, and what it changed said once."""
    changed: list[str] = []
    try:
        with ExitStack() as stack:
            stack.enter_context(_threads(changed, owner))
            stack.enter_context(_process_state(changed))
            stack.enter_context(warnings.catch_warnings())
            stack.enter_context(_random_state())
            stack.enter_context(_torch_state(changed))
            stack.enter_context(_switches(changed, _interpreter_switches()))
            stack.enter_context(process_tables(changed))  # innermost: puts back os.chdir & co. the others call
            yield
    finally:
        _say(owner, changed)
