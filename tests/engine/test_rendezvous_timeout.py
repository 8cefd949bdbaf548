"""A launched run whose other processes never come (rank 0 waiting for them, or a rank connecting to a port
nobody listens on) stops within run.distributed_timeout_s with one line naming MASTER_ADDR:MASTER_PORT, its rank
and the setting, exit 1; before, it waited for torch's 30-minute default and then printed a C++ stack trace.
Drawn ranks and timeouts; each case is a real `grpo-engine train` process (torch's import is most of its time)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from processes import free_port, subprocess_env

# Starting Python and importing torch, transformers and accelerate on a loaded 2-core machine.
STARTUP_S = 60.0


@pytest.mark.slow
# two engine starts (about 15 s each on CI's two cores); each run draws fresh ranks and timeouts
@settings(max_examples=2, deadline=None)
@given(rank=st.integers(0, 2), timeout_s=st.floats(1.0, 3.0))
def test_a_rendezvous_nobody_joins_ends_within_the_timeout_in_one_line(rank, timeout_s, tmp_path_factory):
    port = free_port()
    env = dict(subprocess_env(), WORLD_SIZE="3", RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="3",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    output = tmp_path_factory.mktemp("rendezvous") / "run"
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "grpo_engine", "train", "--max-steps", "1", "--output-dir",
                             str(output), "--run.distributed_timeout_s", str(timeout_s)],
                            env=env, capture_output=True, text=True, timeout=STARTUP_S + 10 * timeout_s)
    took = time.monotonic() - started
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"127.0.0.1:{port}" in last and "run.distributed_timeout_s" in last and f"process {rank} of" in last, last
    assert "Traceback" not in result.stderr and took < STARTUP_S + 10 * timeout_s
    assert not output.exists() or not any(output.iterdir())  # nothing written for a run that never started
    assert "frame #" not in result.stderr and "[c10d]" not in result.stderr  # torch's C++ retry logs: dropped


class _ForeignProgram:
    """A program holding a port that answers whatever connects as an HTTP server would (a vLLM server on the
    launch's MASTER_PORT)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:  # closed
                return
            with contextlib.suppress(OSError):
                client.recv(64)
                client.sendall(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            client.close()


@pytest.mark.slow
def test_another_program_on_master_port_is_said_once_without_torchs_retry_logs(tmp_path):
    """Before, a rank whose MASTER_PORT another program held printed 124 lines of C++ retry logs for a 15 s
    timeout, none saying what answered there."""
    foreign = _ForeignProgram()
    env = dict(subprocess_env(), WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(foreign.port))
    try:
        result = subprocess.run([sys.executable, "-m", "grpo_engine", "train", "--max-steps", "1", "--output-dir",
                                 str(tmp_path / "run"), "--run.distributed_timeout_s", "3"],
                                env=env, capture_output=True, text=True, timeout=STARTUP_S + 60)
    finally:
        foreign.server.close()
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and f"127.0.0.1:{foreign.port}" in lines[-1], result.stderr[-3000:]
    notes = [line for line in lines if "not torch's rendezvous store" in line]
    assert len(notes) == 1 and "'HTTP'" in notes[0] and "MASTER_PORT" in notes[0], result.stderr[-3000:]
    assert "frame #" not in result.stderr and "[c10d]" not in result.stderr, result.stderr[-3000:]


@pytest.mark.parametrize("timeout_s", [0.001, 0.5, 5.0, 19.9])
def test_a_join_that_fails_within_a_short_timeout_names_the_timeout_before_the_address(timeout_s):
    """A timeout of milliseconds (set for a quick failure in a test) ended the join before the others could start,
    and the line blamed MASTER_ADDR / MASTER_PORT alone."""
    from grpo_engine.process_group import _join_advice

    advice = _join_advice(timeout_s)
    assert advice.startswith(f"{timeout_s:g} s may be less than the processes take to start and meet")
    assert "run.distributed_timeout_s" in advice and "MASTER_ADDR" in advice
    assert _join_advice(1800.0).startswith("start every process with the same MASTER_ADDR")
