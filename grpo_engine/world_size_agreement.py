"""The launch's rendezvous: torch's env:// join, with every process's WORLD_SIZE agreed before the group forms.

Processes started by hand with different WORLD_SIZE values (a script that computes it per host, a line edited on one
host only) joined in torch's own way: rank 0's store waited for as many clients as its WORLD_SIZE said, then gloo or
NCCL waited for ranks that would never come. Measured here with two processes, WORLD_SIZE 2 and 3 and a 10 s
timeout: one failed after 10 s, the other after 50 s, both blaming MASTER_ADDR and MASTER_PORT. Here each process
writes its WORLD_SIZE into the store (rank 0 hosts it, as torch's env:// does) and reads rank 0's: a process whose
value differs stops at once in one line naming both values, and says so in the store, so that the others, rank 0
included, stop with the same line instead of waiting out the timeout.

It is registered as its own rendezvous scheme (`torch.distributed.register_rendezvous_handler`, public) and given to
accelerate as the process group's init_method, so accelerate still picks the backend and makes the group.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Iterator
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist

from .config import ConfigError

SCHEME = "grpo-engine-env"
INIT_METHOD = f"{SCHEME}://"
_POLL_S = (0.05, 1.0)  # the first and the longest pause between looks at the store while others join


def register() -> None:
    """Make INIT_METHOD known to torch (once per process)."""
    try:
        dist.register_rendezvous_handler(SCHEME, _rendezvous)
    except RuntimeError:  # registered already: torch refuses a second handler for a scheme
        pass


def _setting(query: dict[str, list[str]], key: str, variable: str) -> str:
    # torch adds rank and world_size to the URL's query when its caller passes them (accelerate does on CPU)
    value = query.get(key, [os.environ.get(variable, "")])[0]
    if not value:
        raise ValueError(f"environment variable {variable} expected by the launch's rendezvous, but not set")
    return value


def _rendezvous(url: str, timeout: timedelta = timedelta(minutes=30), **_: object
                ) -> Iterator[tuple[dist.Store, int, int]]:
    query = parse_qs(urlparse(url).query)
    rank, world_size = int(_setting(query, "rank", "RANK")), int(_setting(query, "world_size", "WORLD_SIZE"))
    host, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    if not host or not port:
        raise ValueError(f"environment variable {'MASTER_ADDR' if not host else 'MASTER_PORT'} expected by the "
                         "launch's rendezvous, but not set")
    use_libuv = query.get("use_libuv", [os.environ.get("USE_LIBUV", "1")])[0] == "1"
    # As torch's env:// (rendezvous._create_c10d_store): under torchrun's agent the agent hosts the store; otherwise
    # rank 0 does, multi-tenant. Not waiting for WORLD_SIZE clients in the constructor: agree() waits, and can say
    # why it stopped.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    if agent_store:
        store = dist.TCPStore(host, int(port), world_size, False, timeout)
    else:
        store = dist.TCPStore(host, int(port), world_size, rank == 0, timeout, wait_for_workers=False,
                              multi_tenant=True, use_libuv=use_libuv)
    agree(store, rank, world_size, timeout.total_seconds())
    yield store, rank, world_size
    raise RuntimeError(f"Unable to perform re-rendezvous using {INIT_METHOD} method")


def agree(store: dist.Store, rank: int, world_size: int, timeout_s: float) -> None:
    """Return once every rank of `world_size` has said the same WORLD_SIZE in `store`; ConfigError as soon
    as one says another (this process's, or another's it learns of); TimeoutError naming the missing ranks after
    `timeout_s`."""
    # a torchrun restart (--max-restarts) meets on the agent's store again, which keeps the last attempt's keys
    prefix = f"grpo-engine/world-size/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    store.set(f"{prefix}{rank}", str(world_size))
    deadline = time.monotonic() + timeout_s
    if rank != 0:
        store.wait([f"{prefix}0"], timedelta(seconds=max(timeout_s, 0.001)))
        first = int(store.get(f"{prefix}0"))
        if first != world_size:
            said = _disagreement(rank, world_size, 0, first)
            store.set(f"{prefix}disagreement", said)
            raise ConfigError(said)
    agreed = store.add(f"{prefix}agreed", 1)
    pause = _POLL_S[0]
    try:
        while agreed < world_size:
            if store.check([f"{prefix}disagreement"]):
                raise ConfigError(store.get(f"{prefix}disagreement").decode())
            if time.monotonic() > deadline:
                missing = [r for r in range(world_size) if not store.check([f"{prefix}{r}"])]
                raise TimeoutError(f"{world_size - agreed} of WORLD_SIZE={world_size} processes did not join within "
                                   f"{timeout_s:g} s (ranks not seen: {_ranks(missing)})")
            time.sleep(pause)
            pause = min(pause * 2, _POLL_S[1])
            agreed = store.add(f"{prefix}agreed", 0)
    except dist.DistError:  # rank 0 hosts the store: it gave up waiting (its own timeout) a moment before this one
        raise TimeoutError(f"process 0, which holds the rendezvous, stopped waiting before all WORLD_SIZE={world_size} "
                           f"processes joined ({agreed} had)") from None


def _disagreement(rank: int, world_size: int, other: int, other_size: int) -> str:
    return (f"environment variable WORLD_SIZE differs between the processes of this launch: process {rank} has "
            f"WORLD_SIZE={world_size}, process {other} has WORLD_SIZE={other_size}; give every process the same "
            f"WORLD_SIZE, the number of processes (torchrun and accelerate launch do)")


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:8]))
    return shown + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "") if ranks else "none"
