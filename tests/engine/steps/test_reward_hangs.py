"""A reward function that never returns, in each way one can: sleeps, waits on stdin (a pipe whose writer never
writes), deadlocks on a lock, waits on an event, spins, waits on a socket, swallows every exception in a loop, or
is stuck in C code (a regular expression backtracking for hours, holding the GIL). Each drawn case ends within
rewards.timeout_seconds plus the stop grace, in one line naming the function and the setting; one that returns in
time is never ended by the watchdog afterwards. Before, the last two hung for ever. Each case runs in its own
process, as the watchdog ends the process it guards."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from hypothesis import given, settings, strategies as st

from hanging_rewards import DEAF, NEVER_RETURN
from processes import subprocess_env

CHILD = """
import sys, time
import hanging_rewards
from grpo_engine.steps import reward_timeout
from grpo_engine.steps.rewards import NamedReward, RewardFunctionError, score_completions
name, limit, grace = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
reward_timeout.STOP_GRACE_S = grace
try:
    score_completions([NamedReward(name, getattr(hanging_rewards, name), 1.0, limit)], ["p"], ["c"], {}, [[1]])
except RewardFunctionError as exc:
    print(exc, file=sys.stderr)
    sys.exit(3)
time.sleep(limit + grace + 0.5)  # past where an armed watchdog would end the process
print("survived", file=sys.stderr)
"""
STARTUP_S = 60.0  # Python, torch and transformers on a loaded 2-core machine


@settings(max_examples=10, deadline=None)
@given(name=st.sampled_from(NEVER_RETURN + ("returns_in_time",)), limit=st.floats(0.2, 0.6),
       grace=st.floats(0.2, 0.8))
def test_a_reward_that_never_returns_ends_within_its_limit_in_one_line(name, limit, grace):
    read_end, write_end = os.pipe()  # stdin whose writer never writes: input() waits
    try:
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-c", CHILD, name, repr(limit), repr(grace)], stdin=read_end,
                              env=subprocess_env(), capture_output=True, text=True, timeout=STARTUP_S + 30)
        took = time.monotonic() - started
    finally:
        os.close(read_end)
        os.close(write_end)
    last = done.stderr.strip().splitlines()[-1]
    if name == "returns_in_time":
        assert done.returncode == 0 and last == "survived", done.stderr[-2000:]
        return
    assert f"reward function {name!r} did not return within {limit:g} s (rewards.timeout_seconds" in last, last
    assert done.returncode == (-9 if name in DEAF else 3), (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and took < STARTUP_S + limit + grace + 5
