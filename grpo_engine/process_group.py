"""Joining the processes of a launched run (WORLD_SIZE > 1) within `run.distributed_timeout_s`.

accelerate's Accelerator makes the process group; torch's rendezvous then waits for every rank for the group's
timeout (30 minutes by default) and fails with a C++ stack trace naming no variable. Here the timeout is the
setting's, and a failure to join is one line naming where the processes meet, this process's rank and what to
check. The same timeout bounds each collective: a process that stops answering mid-run ends the others' wait.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs


class ProcessGroupError(RuntimeError):
    """The processes of a launched run did not find each other."""


def launched() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def join_processes(cpu: bool, timeout_s: float) -> Accelerator:
    """The run's Accelerator, its process group (when launched) joined within `timeout_s` or ProcessGroupError."""
    joining = launched() and not (torch.distributed.is_available() and torch.distributed.is_initialized())
    try:
        return Accelerator(cpu=cpu, kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=timeout_s))])
    except Exception as exc:  # noqa: BLE001 - torch's store and rendezvous errors have no common class but this
        if not joining:
            raise
        env = os.environ
        cause = " ".join(str(exc).split("\n", 1)[0].split())[:160]  # torch appends a C++ stack trace
        raise ProcessGroupError(
            f"process {env.get('RANK', '?')} of WORLD_SIZE={env['WORLD_SIZE']} could not join the others at "
            f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')} within {timeout_s:g} s "
            f"(run.distributed_timeout_s): {type(exc).__name__}: {cause}; start every process with the same "
            f"MASTER_ADDR and MASTER_PORT (torchrun and accelerate launch set them) and check that rank 0's host "
            f"is reachable on that port") from None
