"""Every signal whose default action would end a training process stops it at the step boundary with a checkpoint,
as SIGTERM does: SIGUSR1 / SIGUSR2 (a scheduler's warning before it ends the job), SIGXCPU (the CPU-time limit),
SIGALRM, SIGPWR, the real-time signals. Before, each ended the process at once, the steps since the last checkpoint
lost, with not a line (7 of 9 such signals sent to a run; SIGPIPE and SIGXFSZ are Python's to ignore). Which
signals end a process is asked of the platform here (a child killed by each), not taken from the engine's list; a
signal ignored or handled by someone else when training starts stays theirs."""

from __future__ import annotations

import functools
import json
import os
import resource
import signal
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from grpo_engine.state.cpu_time_limit import warning_soft_limit
from grpo_engine.state.interrupt import signal_name, stop_at_step_boundary
from grpo_engine.steps.reward_timeout import time_limit

from repo_paths import ROOT

# The default actions that report a fault of the process itself or ask for a core dump: left to end it.
FAULTS = {"SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE", "SIGSEGV", "SIGSYS"}

# For each signal: does a child with every action at its default die of it? (stopping ones are continued)
_ENDS_A_PROCESS = r"""
import json, os, signal, time
ending = []
for signum in sorted(signal.valid_signals()):
    if signum in (signal.SIGKILL, signal.SIGSTOP):
        continue
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):
            os._exit(3)
        os.kill(os.getpid(), signum)
        time.sleep(0.05)
        os._exit(0)
    _, status = os.waitpid(pid, os.WUNTRACED)
    if os.WIFSTOPPED(status):
        os.kill(pid, signal.SIGCONT)
        _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signum:
        ending.append(signum)
print(json.dumps(ending))
"""

# Each case: a signal, the action it has when training starts, sent to the process inside the stop handlers.
_SEND = r"""
import json, os, signal, sys
from grpo_engine.state.interrupt import signal_name, stop_at_step_boundary
seen = []
for signum, start in json.loads(sys.argv[1]):
    got = []
    theirs = lambda s, f: got.append(s)
    before = {"default": signal.SIG_DFL, "ignored": signal.SIG_IGN, "handled": theirs}[start]
    signal.signal(signum, before)
    with stop_at_step_boundary(True) as stop:
        os.kill(os.getpid(), signum)
    seen.append(("stop", stop.signal_name == signal_name(signum)) if stop.signal_name else
                ("theirs", got[0]) if got else ("none", signum))
    assert signal.getsignal(signum) == before, signum  # put back
print("ALIVE " + json.dumps(seen))
"""


@functools.lru_cache(maxsize=1)
def signals_that_end_a_process() -> list[int]:
    done = subprocess.run([sys.executable, "-c", _ENDS_A_PROCESS], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [signum for signum in json.loads(done.stdout) if signal_name(signum) not in FAULTS]


def _in_a_child(cases: list[tuple[int, str]]) -> list:
    done = subprocess.run([sys.executable, "-c", _SEND, json.dumps(cases)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and "ALIVE" in done.stdout, (cases, done.returncode, done.stderr[-2000:])
    return json.loads(done.stdout.split("ALIVE ", 1)[1])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX signals")
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_a_signal_that_would_end_the_run_stops_it_at_the_step_boundary(data):
    ending = signals_that_end_a_process()
    assert signal.SIGUSR1 in ending and signal.SIGTERM in ending
    cases = data.draw(st.lists(st.tuples(st.sampled_from(ending), st.sampled_from(["default", "ignored", "handled"])),
                               min_size=1, max_size=8, unique_by=lambda case: case[0]))
    seen = _in_a_child(cases)
    for (signum, start), outcome in zip(cases, seen):
        if start == "default" or signum in (signal.SIGINT, signal.SIGTERM):  # these two are always the engine's
            assert outcome == ["stop", True], (signum, start, seen)
        elif start == "handled":
            assert outcome == ["theirs", signum], (signum, start, seen)
        else:
            assert outcome == ["none", signum], (signum, start, seen)


def test_a_schedulers_sigusr1_during_a_reward_call_is_not_swallowed_by_its_time_limit():
    with stop_at_step_boundary(True) as stop, time_limit(60.0):
        os.kill(os.getpid(), signal.SIGUSR1)  # the time limit's own signal is SIGUSR1 too
    assert stop.signal_name == "SIGUSR1"


@settings(max_examples=200, deadline=None)
@given(hard=st.integers(1, 10**7), soft=st.one_of(st.none(), st.integers(1, 10**7)), used=st.floats(0, 10**7))
def test_the_soft_cpu_limit_warns_before_the_hard_one_whenever_there_is_room(hard, soft, used):
    soft = None if soft is None else min(soft, hard)
    lowered = warning_soft_limit(soft, hard, used)
    effective = soft if lowered is None else lowered
    if lowered is not None:
        assert used < lowered < hard and (soft is None or lowered < soft)
    room = hard - int(used) - 1  # whole CPU seconds between the next one and the hard limit
    if room > 1:  # SIGXCPU can come before the SIGKILL
        assert effective is not None and effective < hard


_BURN = r"""
import math, resource, sys
from grpo_engine.state.interrupt import stop_at_step_boundary
usage = resource.getrusage(resource.RUSAGE_SELF)
limit = math.ceil(usage.ru_utime + usage.ru_stime) + 2
resource.setrlimit(resource.RLIMIT_CPU, (limit, limit))  # what `ulimit -t` sets: no warning before the kill
with stop_at_step_boundary(True) as stop:
    while stop.signal_name is None:
        sum(range(10000))
print("stopped by", stop.signal_name)
assert resource.getrlimit(resource.RLIMIT_CPU) == (limit, limit)  # put back
"""


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_CPU"), reason="no CPU-time limit")
def test_a_cpu_time_limit_warns_in_time_to_save_instead_of_killing():
    done = subprocess.run([sys.executable, "-c", _BURN], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and "stopped by SIGXCPU" in done.stdout, (done.returncode, done.stderr[-2000:])
    assert "SIGXCPU received (the CPU-time limit, ulimit -t, is near)" in done.stderr
