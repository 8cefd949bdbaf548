"""A process of a launched run lost mid-run: one line naming it, not gloo's message.

When one process of a torchrun / accelerate launch ends (killed, out of memory, its own error), the others fail in
their next collective with gloo's text: "[.../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:37801:
Connection reset by peer. ... GLHF!", naming no process, no setting and no way on; a process that stops answering
(SIGSTOP, a hung machine) ended the others' wait after run.distributed_timeout_s with "Timed out waiting 10000ms
for recv operation to complete". Each process records where every process runs (host and pid) when the group is
joined, so a survivor can say which process on its own machine has ended or is stopped, the last checkpoint and how
to go on.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import torch

from .process_group import ProcessGroupError, launched

# (host, pid) of each process, by rank: recorded once the process group is joined (record_processes).
_processes: list[tuple[str, int]] = []

# How long a survivor waits for a peer on its machine whose connection closed to be seen ending: a process stopping on
# its own error closes its sockets in Python's teardown, before the kernel's exit. Short: under torchrun the launcher
# sends the survivors SIGTERM about 0.1 s after it reaps the lost process, and this line must be out first.
_SETTLE_S = 0.3
# The kernel's flag of a process in its exit (PF_EXITING, include/linux/sched.h): set before a killed process's
# sockets close, so such a peer is seen ending without waiting for it to become a zombie.
_PF_EXITING = 0x4


def record_processes() -> None:
    """Gathers every process's host and pid (one collective, when the group is joined)."""
    gathered: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, (socket.gethostname(), os.getpid()))
    _processes[:] = [(str(host), int(pid)) for host, pid in gathered]


def is_peer_failure(exc: BaseException) -> bool:
    """A collective that failed because another process went away or stopped answering: torch's distributed errors,
    and gloo's, which reach Python as a RuntimeError whose text starts with the gloo source file that raised it."""
    return isinstance(exc, getattr(torch.distributed, "DistError", ())) or (
        isinstance(exc, RuntimeError) and "/gloo/" in str(exc))


def _state(pid: int) -> Optional[str]:
    """'ended', 'stopped' or None (running, or not known here) for a process of this machine."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "ended"
    except OSError:  # no /proc (macOS): whether it exists at all
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "ended"
        except OSError:
            return None
        return None
    fields = stat.rpartition(")")[2].split()  # the fields after the command name, which may hold ')' or spaces
    if not fields:
        return None
    if len(fields) > 6 and fields[6].isdigit() and int(fields[6]) & _PF_EXITING:
        return "ended"
    return {"Z": "ended", "X": "ended", "T": "stopped", "t": "stopped"}.get(fields[0])


def _lost_here(settle_s: float) -> list[str]:
    """The processes of this machine that have ended or are stopped, each as "process R (pid P, STATE)"."""
    me, host = os.getpid(), socket.gethostname()
    local = [(rank, pid) for rank, (name, pid) in enumerate(_processes) if name == host and pid != me]
    deadline = time.monotonic() + settle_s
    while True:
        lost = [(rank, pid, state) for rank, pid in local if (state := _state(pid)) is not None]
        if lost or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    meaning = {"ended": "which has ended", "stopped": "stopped: SIGSTOP, a debugger or Ctrl-Z"}
    return [f"process {rank} (pid {pid} on this machine, {meaning[state]})" for rank, pid, state in lost]


def _gloo_cause(text: str) -> str:
    """gloo's own words, without its source path and its advice: "Connection reset by peer"."""
    text = " ".join(re.sub(r"^\[[^\]]*\]\s*", "", text.strip()).split())
    found = re.search(r"Connection (reset|closed) by peer|Broken pipe|Timed out waiting [0-9]+ ?ms[^.]*", text)
    return found.group(0) if found else text[:120]


def lost_process_error(exc: BaseException, timeout_s: float, run_dir: str,
                       settle_s: float = _SETTLE_S) -> Optional[ProcessGroupError]:
    """The one-line error for a collective that failed because another process went away; None for any other."""
    if not is_peer_failure(exc):
        return None
    if not _processes:
        return _lost_while_meeting(exc)
    from .state.checkpoint import list_checkpoints  # the run's, as this process sees its directory

    timed_out = "timed out" in str(exc).lower() or "timeout" in type(exc).__name__.lower()
    lost = _lost_here(0.0 if timed_out else settle_s)
    others = sorted({host for host, _ in _processes} - {socket.gethostname()})
    who = ", ".join(lost) if lost else "another process of the run" + (
        f" (here or on {', '.join(others[:3])})" if others else "")
    cause = (f"no answer within {timeout_s:g} s (run.distributed_timeout_s)" if timed_out
             else "its connection closed: a process that is killed, runs out of memory or stops on its own error "
                  "(its own message, or the launcher's report, says which) ends the others' next collective")
    try:
        saved = list_checkpoints(run_dir)
    except OSError:
        saved = []
    last = f"the last checkpoint is {saved[-1]}" if saved else "no checkpoint was saved yet"
    return ProcessGroupError(
        f"process {_rank()} of WORLD_SIZE={len(_processes)} lost {who}: {cause} "
        f"(gloo: {_gloo_cause(str(exc))}); the run stopped, {last}: continue with --resume under the same launcher "
        f"once every process can run")


def _lost_while_meeting(exc: BaseException) -> ProcessGroupError:
    """A peer lost in the first collective, before the processes were recorded: gloo's raw text reached the user
    (a process started by hand with another WORLD_SIZE, or a second process given the same RANK, joined and then
    never answered or dropped out). What a launch of hand-set variables must hold is said instead."""
    env = os.environ
    return ProcessGroupError(
        f"process {_rank()} of WORLD_SIZE={env.get('WORLD_SIZE', '?')} lost another process while the processes met, "
        f"before any work (gloo: {_gloo_cause(str(exc))}): every process must be started with the same WORLD_SIZE, "
        f"MASTER_ADDR and MASTER_PORT and a RANK of its own from 0 to WORLD_SIZE - 1 (torchrun and accelerate launch "
        f"set them), and none may stop on its own error (its message, or the launcher's report, says which)")


def outlast_the_launchers_stop() -> None:
    """Under torchrun (its workers have TORCHELASTIC_RUN_ID), SIGTERM is ignored from here on: the launcher sends it to
    the survivors about 0.1 s after it reaps the lost process, which on a loaded machine ended a survivor before its
    line was out. The process is on its way out; the launcher's SIGKILL, 30 s later, still ends one that hangs."""
    if os.environ.get("TORCHELASTIC_RUN_ID") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _rank() -> str:
    return str(torch.distributed.get_rank()) if torch.distributed.is_initialized() else os.environ.get("RANK", "?")


@contextmanager
def lost_processes_named(timeout_s: float, run_dir: str) -> Iterator[None]:
    """Around a launched run: a collective failed by a lost process becomes lost_process_error's one line."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - only a peer failure is replaced; anything else goes on as it was
        if not launched():
            raise
        if is_peer_failure(exc):
            outlast_the_launchers_stop()
        error = lost_process_error(exc, timeout_s, run_dir)
        if error is None:
            raise
        raise error from None
