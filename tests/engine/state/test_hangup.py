"""SIGHUP (the terminal a run was started from went away: an ssh connection dropped, the window closed) stops
training at the step boundary with a checkpoint, as SIGTERM does, and a terminal that is gone cannot stop the step
in progress. Before, SIGHUP's default action ended the process at once: the steps since the last checkpoint were
lost, and nothing said why. Each case runs in a process of its own, whose output is a terminal (a pty), hung up or
not, or a file."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

ROOT = Path(__file__).parents[3]

# A training loop in miniature: the progress bar's writes to stdout and stderr at every step, the stop request read
# at the step boundary, then what a stop does (the checkpoint, the last lines).
CHILD = r"""
import sys, time
from grpo_engine.state.interrupt import outlive_the_terminal, stop_at_step_boundary
from grpo_engine.messages import show_messages
show_messages()
outlive_the_terminal()  # as grpo_engine.cli.main does first
marker, steps_before = sys.argv[1], int(sys.argv[2])
with stop_at_step_boundary(True) as stop:
    step = 0
    print("ready", flush=True)
    while stop.signal_name is None:
        step += 1
        sys.stderr.write(f"\rgrpo {step} it\n"); sys.stderr.flush()
        print(f"step {step}", flush=True)
        time.sleep(0.01)
    for _ in range(3):  # what follows the stop: the checkpoint's notes, the bar closed, the hint
        print("after the stop", flush=True)
        sys.stderr.write("stopped after step\n"); sys.stderr.flush()
    open(marker, "w").write(f"saved after {stop.signal_name}")
"""


def _wait_for(fd: int, text: bytes, timeout: float = 30.0) -> bytes:
    seen, deadline = b"", time.monotonic() + timeout
    while text not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            seen += os.read(fd, 4096)
    assert text in seen, seen[-500:]
    return seen


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(output=st.sampled_from(["terminal hung up", "terminal still there", "a file"]),
       sig=st.sampled_from(["SIGHUP", "SIGTERM"]), wait=st.floats(0.0, 0.2))
def test_a_hangup_stops_at_the_step_boundary_with_a_checkpoint(output, sig, wait, tmp_path):
    if sig == "SIGTERM" and output == "terminal hung up":
        output = "terminal still there"  # a hung-up terminal sends SIGHUP
    marker = tmp_path / f"marker-{time.monotonic_ns()}"
    log = tmp_path / "log.txt"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    master = slave = None
    if output == "a file":
        sink = open(log, "wb")
    else:
        master, slave = os.openpty()
        sink = slave
    try:
        terminal = os.ttyname(slave) if slave is not None else None

        def take_terminal() -> None:  # the pty becomes the child's controlling terminal: its hangup sends SIGHUP
            # a run started from a terminal: SIGHUP at its default, even where these tests run under nohup (an
            # ignored signal stays ignored across exec, and the run rightly keeps ignoring it)
            signal.signal(signal.SIGHUP, signal.SIG_DFL)
            if terminal is not None:
                os.close(os.open(terminal, os.O_RDWR))

        child = subprocess.Popen([sys.executable, "-c", CHILD, str(marker), "0"], env=env, stdin=subprocess.DEVNULL,
                                 stdout=sink, stderr=sink, start_new_session=True, preexec_fn=take_terminal)
        try:
            if master is not None:
                _wait_for(master, b"ready")
            else:
                deadline = time.monotonic() + 30
                while b"ready" not in log.read_bytes() and time.monotonic() < deadline:
                    time.sleep(0.02)
            time.sleep(wait)
            if output == "terminal hung up":
                os.close(slave)
                slave = None
                os.close(master)  # the hangup: the kernel sends SIGHUP, and writes to the terminal fail (EIO)
                master = None
            else:
                child.send_signal(getattr(signal, sig))
            code = child.wait(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    finally:
        for fd in (master, slave):
            if fd is not None:
                os.close(fd)
        if output == "a file":
            sink.close()
    assert code == 0, f"exit status {code}"
    assert marker.read_text() == f"saved after {sig}"
    if output == "a file":  # a `kill -HUP` of a run whose output goes to a file: the file keeps all of it
        text = log.read_text()
        assert text.count("after the stop") == 3 and f"{sig} received" in text, text[-500:]


def test_a_hangup_ignored_when_training_starts_stays_ignored():
    """nohup: the run goes on through a hangup."""
    from grpo_engine.state.interrupt import stop_at_step_boundary

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_at_step_boundary(True) as stop:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            assert stop.signal_name is None
    finally:
        signal.signal(signal.SIGHUP, previous)
