"""A full disk at a run's first save: the message no longer says "continue with --resume" (there is nothing to
resume from: --resume then said only "no complete checkpoint", and a fresh start was refused for the run's logs).
Both now say how to start again; with an earlier checkpoint, the advice stays --resume."""

from __future__ import annotations

import errno
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.state import checkpoint as ckpt


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(earlier=st.lists(st.integers(1, 9), max_size=2, unique=True), logged=st.integers(0, 3))
def test_the_advice_after_a_full_disk_leads_somewhere(earlier, logged, tmp_path_factory, monkeypatch):
    run_dir = tmp_path_factory.mktemp("run")
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, logged + 1)))
    for step in earlier:
        directory = ckpt.checkpoint_root(run_dir) / f"checkpoint-{step:06d}"
        directory.mkdir(parents=True)
        (directory / ckpt.STATE_FILE).write_text(json.dumps({"step": step, "sampler": {"epoch": 0, "offset": 0}}))
        ckpt.write_manifest(directory)

    def full(accelerator, run_dir, step, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "_write_checkpoint", full)
    with pytest.raises(ckpt.CheckpointError) as raised:
        ckpt.save_checkpoint(None, run_dir, 10)
    message = str(raised.value)
    assert "\n" not in message and "no space left" in message
    if earlier:
        assert "--resume" in message and f"checkpoint-{max(earlier):06d}" in message
        assert ckpt.resolve_resume("latest", run_dir).step == max(earlier)
    else:
        assert "continue with --resume" not in message and "without --resume" in message
        with pytest.raises(ckpt.CheckpointError, match="leave out --resume"):
            ckpt.resolve_resume("latest", run_dir)
