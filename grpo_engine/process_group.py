"""Joining the processes of a launched run (WORLD_SIZE > 1) within `run.distributed_timeout_s`.

accelerate's Accelerator makes the process group; torch's rendezvous then waits for every rank for the group's
timeout (30 minutes by default) and fails with a C++ stack trace naming no variable. Here the timeout is the
setting's, and a failure to join is one line naming where the processes meet, this process's rank and what to
check. The same timeout bounds each collective: a process that stops answering mid-run ends the others' wait.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from datetime import timedelta

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

from . import world_size_agreement
from .config import ConfigError
from .rendezvous_log import quiet_store_retries


_log = logging.getLogger(__name__)  # grpo_engine/messages.py: how the CLI shows it

WAIT_NOTE_S = 20.0  # a launch whose processes start within this of each other joins without a note


class ProcessGroupError(RuntimeError):
    """The processes of a launched run did not find each other."""


def launched() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def join_processes(cpu: bool, timeout_s: float) -> Accelerator:
    """The run's Accelerator, its process group (when launched) joined within `timeout_s` or ProcessGroupError."""
    joining = launched() and not (torch.distributed.is_available() and torch.distributed.is_initialized())
    # torch's rendezvous waits in silence: a WORLD_SIZE exported in a shell (no launcher, no other process) looked like
    # a hung run for the whole timeout. The wait is said once, halfway or after WAIT_NOTE_S.
    note = threading.Timer(min(WAIT_NOTE_S, timeout_s / 2), _say_waiting, args=(timeout_s,)) if joining else None
    if note is not None:
        note.daemon = True
        note.start()
    env = os.environ
    quiet = quiet_store_retries(f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}") if joining else \
        contextlib.nullcontext()
    try:
        world_size_agreement.register()
        group = InitProcessGroupKwargs(init_method=world_size_agreement.INIT_METHOD,
                                       timeout=timedelta(seconds=timeout_s))
        with quiet:
            accelerator = Accelerator(cpu=cpu, kwargs_handlers=[group])
    except ConfigError:  # the launch's settings disagree (world_size_agreement): said in its own words
        raise
    except Exception as exc:  # noqa: BLE001 - torch's store and rendezvous errors have no common class but this
        if not joining:
            raise
        cause = " ".join(str(exc).split("\n", 1)[0].split())[:160]  # torch appends a C++ stack trace
        raise ProcessGroupError(
            f"process {env.get('RANK', '?')} of WORLD_SIZE={env['WORLD_SIZE']} could not join the others at "
            f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')} within {timeout_s:g} s "
            f"(run.distributed_timeout_s): {type(exc).__name__}: {cause}; {_join_advice(timeout_s)}") from None
    finally:
        if note is not None:
            note.cancel()
    if joining:
        check_rank_unique()
    return accelerator


def _join_advice(timeout_s: float) -> str:
    where = ("start every process with the same MASTER_ADDR and MASTER_PORT (torchrun and accelerate launch set them) "
             "and check that rank 0's host is reachable on that port")
    if timeout_s >= WAIT_NOTE_S:
        return where
    # processes of one launch start seconds apart (more while they import torch): a timeout set for a quick failure
    # in a test ends the join before the others can come, and the address is then not the cause
    return (f"{timeout_s:g} s may be less than the processes take to start and meet: give run.distributed_timeout_s "
            f"more (default 1800); otherwise {where}")


def check_rank_unique() -> None:
    """ConfigError in a process that joined with a RANK another process of the launch already took. Processes started
    by hand (a script that computes RANK wrongly, a line pasted twice) joined both: rank 0 and one of them trained as a
    whole run while the other failed with gloo's raw text, or took the first one's place in the middle of a collective.
    Each process counts its rank once in the group's store; the second to count it stops, naming the variable."""
    store_of = getattr(torch.distributed.distributed_c10d, "_get_default_store", None)
    if store_of is None or not torch.distributed.is_initialized():  # no store to count in: the duplicate still
        return  # fails, in lost_process's words
    env = os.environ
    rank = torch.distributed.get_rank()
    # a torchrun restart (--max-restarts) joins the same agent store again: the count is per attempt
    key = f"grpo-engine/rank-taken/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/{rank}"
    if store_of().add(key, 1) > 1:
        raise ConfigError(f"environment variable RANK={rank}: another process of this launch (WORLD_SIZE="
                          f"{env.get('WORLD_SIZE', '?')} at {env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}) "
                          f"joined as rank {rank} already; give every process a RANK of its own from 0 to WORLD_SIZE - 1 "
                          f"(torchrun and accelerate launch do)")


def _say_waiting(timeout_s: float) -> None:
    env = os.environ
    _log.warning(f"note: process {env.get('RANK', '?')} of WORLD_SIZE={env.get('WORLD_SIZE', '?')} is waiting for the "
                 f"others at {env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}, for at most {timeout_s:g} s "
                 f"(run.distributed_timeout_s); these variables come from the environment, where a launcher (torchrun, "
                 f"accelerate launch) sets them for every process it starts: for a run of one process, unset "
                 f"WORLD_SIZE")
