"""Stop signals are deferred to the step boundary (the whole Ctrl-C path runs in test_cli.py)."""

import os
import signal
import threading

import pytest
from accelerate import Accelerator
from hypothesis import given, settings, strategies as st

from grpo_engine.state.interrupt import stop_at_step_boundary


def test_sigterm_sets_the_flag_and_a_second_ctrl_c_stops_at_once(capsys):
    previous = signal.getsignal(signal.SIGTERM)
    with stop_at_step_boundary(enabled=True) as stop:
        assert not stop.requested(Accelerator(cpu=True))
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested(Accelerator(cpu=True)) and stop.signal_name == "SIGTERM"
        assert "SIGTERM received: stopping after the current step" in capsys.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is previous  # handlers restored after training


def test_disabled_leaves_the_handlers_alone():
    previous = signal.getsignal(signal.SIGINT)
    with stop_at_step_boundary(enabled=False):
        assert signal.getsignal(signal.SIGINT) is previous


STOPPING = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2, signal.SIGALRM]


@settings(max_examples=20, deadline=None)
@given(blocked=st.sets(st.sampled_from(STOPPING), min_size=1), data=st.data())
def test_a_stop_signal_blocked_by_the_parent_still_stops_at_the_boundary(blocked, data):
    """A process started with a signal blocked (the parent's mask is inherited): the signal, sent to the main thread,
    sets the flag during training (it stayed pending: `timeout`'s SIGTERM waited for the SIGKILL), and the caller's
    mask is back afterwards."""
    sent = data.draw(st.sampled_from(sorted(blocked)))
    handlers = {sig: signal.getsignal(sig) for sig in STOPPING}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        with stop_at_step_boundary(enabled=True) as stop:
            signal.pthread_kill(threading.main_thread().ident, sent)
            name = stop.signal_name
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before | blocked
    finally:
        for sig in STOPPING:  # a signal left pending (as before the fix) is dropped, not delivered to pytest
            signal.signal(sig, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert name == signal.Signals(sent).name
