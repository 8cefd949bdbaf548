"""`grpo-engine bench`'s measuring child never outlives the bench. Before (a ProcessPoolExecutor), a Ctrl-C sent to
the bench hung it until the child's measurement ended (over 45 s measured, no line), and a bench ended by SIGTERM
left its child computing alone (1 of 1). Here the parent is a small process waiting on a child that would run for
ever; whatever signal ends the parent, it and the child are gone at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings, strategies as st

from repo_paths import ROOT

PARENT = r"""
import multiprocessing, os, sys, time
from grpo_engine.tools.measuring_child import call_in_child

def measure(path):
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(0.05)

call_in_child(multiprocessing.get_context("fork"), measure, sys.argv[1])
"""


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


SIGNALS = ["SIGINT", "SIGTERM", "SIGHUP", "SIGKILL", "SIGUSR1", "SIGALRM"]


def _default_signals() -> None:
    """In the parent before it runs: every drawn signal at its default, whatever this test run inherited (under
    nohup SIGHUP arrives ignored), and SIGINT at Python's, as under a terminal (a background job of a shell starts
    with it ignored)."""
    for name in SIGNALS:
        if name != "SIGKILL":
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal")
@settings(max_examples=3, deadline=None)
@given(sig=st.sampled_from(SIGNALS))
def test_the_measuring_child_ends_with_the_bench_however_it_ends(sig, tmp_path_factory):
    child_pid = tmp_path_factory.mktemp("child") / "pid"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(child_pid)],
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)
    try:
        deadline = time.monotonic() + 30
        while not (child_pid.exists() and child_pid.read_text()) and time.monotonic() < deadline:
            time.sleep(0.02)
        pid = int(child_pid.read_text())
        parent.send_signal(getattr(signal, sig))
        parent.wait(timeout=10)  # on the pool, a SIGINT waited for the measurement to end
        assert _gone(pid, within=5), f"the measuring child outlived a bench ended by {sig}"
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.communicate()
