"""A launched run stopped by a signal (Ctrl-C on torchrun, scancel) says how to continue: under the same launcher with
as many processes. Before, every process printed the plain `grpo-engine train --resume ...`, which started one process
and was refused for the checkpoint's process count."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine import cli
from grpo_engine.state.interrupt import TrainingInterrupted

from processes import free_port


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world=st.integers(1, 16), signal_name=st.sampled_from(["SIGINT", "SIGTERM", "SIGHUP"]), step=st.integers(1, 99))
def test_the_resume_hint_of_a_launched_run_names_its_launcher(world, signal_name, step, monkeypatch, capsys, tmp_path):
    checkpoint = tmp_path / "run" / "checkpoints" / f"checkpoint-{step:06d}"

    def stopped(args) -> int:
        raise TrainingInterrupted(signal_name, step, checkpoint)

    monkeypatch.setattr(cli, "_train", stopped)
    for name in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    if world > 1:
        for name, value in (("WORLD_SIZE", world), ("RANK", world - 1), ("MASTER_ADDR", "127.0.0.1"),
                            ("MASTER_PORT", free_port())):
            monkeypatch.setenv(name, str(value))
    capsys.readouterr()
    assert cli.main(["train", "--run.output_dir", str(tmp_path / "run")]) == 130
    said = [line for line in capsys.readouterr().err.splitlines() if "Continue with" in line]
    assert len(said) == 1 and f"--output-dir {Path(checkpoint).parent.parent}" in said[0], said
    assert ("under the same launcher" in said[0]) == (world > 1), said
    if world > 1:
        assert f"with {world} processes" in said[0], said
