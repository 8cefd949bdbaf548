"""Processes of one launch given different WORLD_SIZE values: before, torch's rendezvous waited out the timeout (one
process 10 s, the other 50 s at a 10 s timeout) and blamed MASTER_ADDR / MASTER_PORT. Now every process stops at once
in one line naming both values; a missing process is named by its rank after the timeout."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from hypothesis import given, settings, strategies as st

from grpo_engine.config import ConfigError
from grpo_engine.world_size_agreement import agree


def _run_ranks(sizes: list[int], timeout_s: float) -> dict[int, BaseException | None]:
    """agree() of ranks 0..len(sizes)-1, each in a thread with its own WORLD_SIZE, on one store."""
    store = torch.distributed.HashStore()
    outcome: dict[int, BaseException | None] = {}

    def join(rank: int) -> None:
        try:
            agree(store, rank, sizes[rank], timeout_s)
            outcome[rank] = None
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertions
            outcome[rank] = exc

    threads = [threading.Thread(target=join, args=(rank,)) for rank in range(len(sizes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s + 10)
    assert not any(thread.is_alive() for thread in threads), "a rank still waits past its timeout"
    return outcome


@settings(max_examples=25, deadline=None)
@given(processes=st.integers(1, 5), data=st.data())
def test_every_process_stops_at_once_when_one_has_another_world_size(processes, data):
    sizes = [processes] + [data.draw(st.integers(1, 8)) for _ in range(processes - 1)]
    started = time.monotonic()
    outcome = _run_ranks(sizes, timeout_s=30.0)
    if all(size == processes for size in sizes):
        assert all(result is None for result in outcome.values())
        return
    assert time.monotonic() - started < 15, "a disagreement waited for the timeout"
    for rank, result in outcome.items():
        assert isinstance(result, ConfigError), (rank, result)
        message = str(result)
        assert "\n" not in message and message.startswith("environment variable WORLD_SIZE differs")
        named = [f"process {odd} has WORLD_SIZE={size}, process 0 has WORLD_SIZE={processes}"
                 for odd, size in enumerate(sizes) if size != processes]
        assert any(pair in message for pair in named), message  # one of the odd ones: its own, or the first told


def test_a_process_that_never_comes_is_named_after_the_timeout():
    store = torch.distributed.HashStore()
    outcome: list[BaseException] = []
    thread = threading.Thread(target=lambda: outcome.append(pytest.raises(TimeoutError, agree, store, 0, 3, 0.5).value))
    thread.start()
    agree_one = threading.Thread(target=lambda: pytest.raises(TimeoutError, agree, store, 2, 3, 0.5))
    agree_one.start()
    thread.join(10)
    agree_one.join(10)
    assert "1 of WORLD_SIZE=3 processes did not join within 0.5 s (ranks not seen: 1)" in str(outcome[0])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


_JOIN = textwrap.dedent("""
    from grpo_engine.config import ConfigError
    from grpo_engine.process_group import join_processes
    try:
        join_processes(cpu=True, timeout_s=60)
    except ConfigError as exc:
        print("REFUSED", exc)
    else:
        print("JOINED")
""")


@pytest.mark.slow
def test_launched_processes_with_different_world_sizes_stop_in_one_line():
    port = _free_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    processes = [subprocess.Popen([sys.executable, "-c", _JOIN], env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank),
                                                                       "WORLD_SIZE": str(size)},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for rank, size in ((0, 2), (1, 3))]
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    assert time.monotonic() - started < 45, "the processes waited for the 60 s timeout"
    for output in outputs:
        assert ("REFUSED environment variable WORLD_SIZE differs between the processes of this launch: process 1 has "
                "WORLD_SIZE=3, process 0 has WORLD_SIZE=2") in output, output
