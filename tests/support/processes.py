"""Starting the processes of a multi-process test: the environment they see and the torchrun command line."""

from __future__ import annotations

import os
import socket
import sys

from repo_paths import ROOT, SUPPORT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env() -> dict:
    """The repository and tests/support importable (workers, user reward functions), one thread per process,
    and no crash-injection switch left over from another test."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{SUPPORT}", OMP_NUM_THREADS="1")
    env.pop("CRASH_AT_CALL", None)
    return env


def torchrun(*args: str) -> list[str]:
    """`torchrun --nproc_per_node 2` on a free local port, then `args`."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), *args]


def leave_spawned_process() -> None:
    """The end of a torch.multiprocessing.spawn worker whose results are checked and whose gloo group is
    destroyed: exit at once, skipping the interpreter's teardown, in which gloo's threads have aborted a rank
    ("terminate called without an active exception", SIGABRT) after every comparison held, idle machine or not.
    Only the success path calls it: an exception still reaches spawn with its traceback."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
