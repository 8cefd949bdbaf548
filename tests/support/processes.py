"""Starting the processes of a multi-process test: the environment they see and the torchrun command line."""

from __future__ import annotations

import os
import socket
import subprocess
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


def run_workers(command: list[str], timeout: float) -> None:
    """Runs a worker command (one process, or torchrun's group); a failure shows the workers' own stderr."""
    result = subprocess.run(command, env=subprocess_env(), timeout=timeout, capture_output=True, text=True)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(command[-4:])} exited with {result.returncode}; its stderr ends:\n"
                             f"{result.stderr[-4000:]}")


def leave_spawned_process() -> None:
    """The end of a spawned or torchrun worker whose results are checked or saved and whose gloo group is
    destroyed: exit at once, skipping the interpreter's teardown, in which gloo's threads have aborted a rank
    ("terminate called without an active exception", SIGABRT) after every comparison held, idle machine or not.
    Only the success path calls it: an exception still reaches spawn with its traceback."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
