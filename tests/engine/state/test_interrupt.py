"""Stop signals are deferred to the step boundary (the whole Ctrl-C path runs in test_cli.py)."""

import os
import signal

import pytest
from accelerate import Accelerator

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
