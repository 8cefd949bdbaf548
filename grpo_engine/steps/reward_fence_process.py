"""What the reward fence (reward_fence.py) also puts back: the process state the operating system keeps, the functions
of the modules the engine calls, and the engine's own messages.

Each was measured to outlast a reward call and change the run after it:

- the resource limits (`resource.setrlimit`, as a code-execution reward's sandbox sets them in its own process:
  a lowered RLIMIT_AS or RLIMIT_NOFILE failed the next checkpoint's write); a soft limit is set back, a hard limit
  lowered cannot be raised again by an unprivileged process and is said;
- the signal mask (`signal.pthread_sigmask`): SIGINT, SIGTERM or SIGUSR1 blocked kept Ctrl-C, a scheduler's stop
  and the reward time limit itself from ever arriving;
- file descriptors 0, 1 and 2 (`os.dup2(devnull, 2)` to quiet a noisy library, or `os.close(1)`): every later line
  of the engine, its one-line error included, went nowhere;
- functions of any loaded standard-library module, torch and NumPy replaced or deleted, and a hook left unset
  (None) set to the function's code (human-eval's `reliability_guard` sets
  `os.chdir`, `os.remove`, `shutil.rmtree`, `subprocess.Popen` to None; a frozen clock replaces `time.time`), and
  `sys.modules` entries replaced or removed (`sys.modules['json'] = None`): the engine's next checkpoint, or the
  fence's own `os.chdir`, failed naming nothing of the reward. New names (a submodule imported) are left;
- the engine's logger and the root logger (level, handlers, propagation): `logging.basicConfig(...)` in a reward
  module printed each engine warning twice, `getLogger('grpo_engine').setLevel(CRITICAL)` silenced them;
- a process the function forked that returns into the engine (a bare `os.fork()` without `os._exit` in the child)
  would go on training beside its parent in the same run directory: it is ended at once, with one line.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import sys
import threading
from contextlib import contextmanager
from types import BuiltinFunctionType, FunctionType, ModuleType
from typing import Any, Iterator

# The modules whose functions the engine (and the fence itself) calls after a reward ran: their names are put back.
# Every public module of the standard library that is loaded, not a list of the ones known to be called: a list
# missed `copy.deepcopy = None` (every later reward call failed in the fence's copy of its arguments, blamed on that
# function), `resource.getrlimit`, `warnings.warn`, `pickle.dumps` and `sys.exit` (the CLI's own exit).
WATCHED_LIBRARIES = ("os.path", "torch", "torch.nn.functional", "numpy")
_STANDARD_LIBRARY = frozenset(name for name in sys.stdlib_module_names if not name.startswith("_"))


def watched_modules() -> list[str]:
    """The names of the watched modules loaded now (a set intersection in C: sys.modules holds thousands)."""
    return sorted(_STANDARD_LIBRARY & sys.modules.keys()) + [name for name in WATCHED_LIBRARIES if name in sys.modules]


_LIMITS = {name: getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_")}
_STANDARD_FDS = (0, 1, 2)
_LOGGERS = ("", "grpo_engine")  # the root logger, and the engine's (grpo_engine/messages.py: ENGINE_LOGGER)


def _limits() -> dict[str, tuple[int, int]]:
    found = {}
    for name, which in _LIMITS.items():
        try:
            found[name] = resource.getrlimit(which)
        except (OSError, ValueError):  # not on this platform's kernel
            continue
    return found


def _restore_limits(saved: dict[str, tuple[int, int]], changed: list[str]) -> None:
    for name, (soft, hard) in saved.items():
        now_soft, now_hard = resource.getrlimit(_LIMITS[name])
        if (now_soft, now_hard) == (soft, hard):
            continue
        try:
            resource.setrlimit(_LIMITS[name], (soft, hard))
            changed.append(f"changed the resource limit {name}; the engine put it back")
        except (OSError, ValueError):  # a hard limit lowered: only a privileged process may raise it again
            try:
                resource.setrlimit(_LIMITS[name], (min(soft, now_hard) if now_hard >= 0 else soft, now_hard))
            except (OSError, ValueError):
                pass
            changed.append(f"lowered the hard resource limit {name} ({hard} -> {now_hard}), which cannot be raised "
                           f"again; the run goes on under it")


def _descriptor(fd: int) -> Any:
    try:
        status = os.fstat(fd)
    except OSError:
        return None
    return (status.st_dev, status.st_ino, status.st_rdev)


@contextmanager
def _standard_descriptors(changed: list[str]) -> Iterator[None]:
    """Descriptors 0-2 as they were: a copy of each is kept and put back on it when the function pointed it elsewhere
    or closed it."""
    copies = {}
    for fd in _STANDARD_FDS:
        try:
            copies[fd] = (os.dup(fd), _descriptor(fd))
        except OSError:  # not open when the call began: nothing to keep
            continue
    try:
        yield
    finally:
        for fd, (copy, identity) in copies.items():
            try:
                if _descriptor(fd) != identity:
                    os.dup2(copy, fd)
                    changed.append(f"pointed file descriptor {fd} elsewhere or closed it (os.dup2 / os.close); the "
                                   f"engine put it back")
            finally:
                os.close(copy)


def _logger_state(name: str) -> tuple:
    logger = logging.getLogger(name)
    return logger.level, list(logger.handlers), logger.propagate, logger.disabled, list(logger.filters)


def _set_logger_state(name: str, state: tuple) -> None:
    logger = logging.getLogger(name)
    logger.setLevel(state[0])
    logger.handlers[:] = state[1]
    logger.propagate, logger.disabled = state[2], state[3]
    logger.filters[:] = state[4]


def _module_tables() -> dict[str, dict[str, Any]]:
    tables = {}
    for name in watched_modules():
        module = sys.modules.get(name)
        if module is not None:
            tables[name] = dict(vars(module))
    return tables


def _restore_modules(tables: dict[str, dict[str, Any]], modules: dict[str, Any], changed: list[str]) -> None:
    # An entry removed or set to a non-module (None blocks its import); a module replacing its own entry by another
    # module (a lazy loader) is its own business.
    current = sys.modules
    replaced = sorted(key for key, module in modules.items()
                      if current.get(key) is not module and isinstance(module, ModuleType)
                      and not isinstance(current.get(key), ModuleType))
    for key in replaced:
        sys.modules[key] = modules[key]
    names = []
    for name, saved in tables.items():
        namespace = vars(modules[name]) if name in modules else {}
        if _same_namespace(namespace, saved):
            continue
        for attribute, value in saved.items():
            # Functions, classes and modules only: a module's data may change by its own use (tempfile.tempdir is
            # set by the first gettempdir()).
            now = namespace.get(attribute, saved)
            if now is value:  # nearly every name, every call: decided before anything costlier
                continue
            # A hook left unset (None) that now holds the function's own code counts too: threading.settrace(f) set
            # threading._trace_hook, and every thread the engine started after it ran f on each line.
            hook = value is None and callable(now)
            if (callable(value) or isinstance(value, ModuleType) or hook) and not _own(name, now) \
                    and f"{name}.{attribute}" not in _SWITCHED:
                namespace[attribute] = value
                names.append(f"{name}.{attribute}")
    if replaced:
        shown = ", ".join(replaced[:3]) + (", ..." if len(replaced) > 3 else "")
        changed.append(f"replaced or removed modules in sys.modules ({shown}); the engine put them back")
    if names:
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        changed.append(f"replaced functions of modules the engine calls ({shown}); the engine put them back")


def _same_namespace(namespace: dict[str, Any], saved: dict[str, Any]) -> bool:
    """Whether a module's names are all still bound to what they were: one comparison in C, where equal dicts of the
    same objects compare by identity alone (no value's __eq__ runs); a namespace that differs (or whose differing
    value cannot be compared) is walked name by name."""
    try:
        return len(namespace) == len(saved) and namespace == saved
    except Exception:  # a value whose comparison raises (a tensor's ambiguous truth value)
        return False


def _own(module_name: str, value: Any) -> bool:
    """Whether `value` comes from the module's own package, or from the standard library into one of its modules:
    torch rebinds torch.Storage when the default dtype changes (which the fence puts back itself) and wraps
    torch.manual_seed once deterministic algorithms are on; a standard module may set a name of its own on first use
    to a function of another (uuid's from _uuid)."""
    top = (getattr(value, "__module__", None) or "").split(".")[0]
    owner = module_name.split(".")[0]
    library = isinstance(value, (FunctionType, BuiltinFunctionType)) and top in sys.stdlib_module_names
    return bool(top) and (top == owner or owner in _STANDARD_LIBRARY and library)  # not a partial: the user's


# The hooks the fence's interpreter switches put back and name themselves (reward_fence._interpreter_switches).
_SWITCHED = frozenset({"sys.excepthook", "sys.unraisablehook", "threading.excepthook"})


@contextmanager
def process_tables(changed: list[str]) -> Iterator[None]:
    """The body, with the resource limits, the signal mask, descriptors 0-2, the watched modules' names, sys.modules
    and the loggers put back afterwards; each change is appended to `changed`. A forked child that returns here ends."""
    pid = os.getpid()
    limits = _limits()
    main = threading.current_thread() is threading.main_thread()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, []) if main and hasattr(signal, "pthread_sigmask") else None
    loggers = {name: _logger_state(name) for name in _LOGGERS}
    tables = _module_tables()
    modules = dict(sys.modules)
    try:
        with _standard_descriptors(changed):
            yield
    finally:
        if os.getpid() != pid:
            _end_forked_child()
        _restore_modules(tables, modules, changed)  # first: what follows calls os, signal, logging
        _restore_limits(limits, changed)
        if mask is not None and signal.pthread_sigmask(signal.SIG_BLOCK, []) != mask:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            changed.append("changed the signal mask (signal.pthread_sigmask); the engine put it back")
        for name, state in loggers.items():
            if _logger_state(name) != state:
                _set_logger_state(name, state)
                changed.append(f"changed the {'root' if not name else repr(name)} logger (its level, handlers or "
                               f"propagation); the engine put it back")


def _end_forked_child() -> None:
    """A child the function forked came back from it: training on in it would write the parent's run directory too."""
    try:
        os.write(2, f"grpo-engine: process {os.getpid()}, forked by a reward function, returned from it into the "
                    f"engine; it was ended (a forked child ends itself with os._exit)\n".encode())
    finally:
        os._exit(1)
