"""A launched run whose other processes never come (rank 0 waiting for them, or a rank connecting to a port
nobody listens on) stops within run.distributed_timeout_s with one line naming MASTER_ADDR:MASTER_PORT, its rank
and the setting, exit 1; before, it waited for torch's 30-minute default and then printed a C++ stack trace.
Drawn ranks and timeouts; each case is a real `grpo-engine train` process (torch's import is most of its time)."""

from __future__ import annotations

import subprocess
import sys
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
