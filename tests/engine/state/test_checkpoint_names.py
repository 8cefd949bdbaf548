"""Each step has one checkpoint name, checkpoint-NNNNNN (zero-padded to six digits; more digits, without a leading
zero, past step 999999). Before, `checkpoint-0000003` (a user's copy) was taken for step 3 as well: a resume picked
either copy by the order the directory listed them, and rotation (run.save_total_limit) could delete the user's."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.state import checkpoint as ckpt


def _checkpoint(directory: Path, step: int) -> None:
    directory.mkdir(parents=True)
    (directory / ckpt.STATE_FILE).write_text(json.dumps({"step": step, "sampler": {"epoch": 0, "offset": 0}}))
    ckpt.write_manifest(directory)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=st.integers(0, 10**9), zeros=st.integers(1, 4))
def test_a_step_has_one_checkpoint_name(step, zeros, tmp_path_factory):
    root = tmp_path_factory.mktemp("run") / "checkpoints"
    canonical = root / f"checkpoint-{step:06d}"
    padded = root / f"checkpoint-{'0' * zeros}{step:06d}"
    assert ckpt.checkpoint_step(canonical) == step and ckpt.checkpoint_step(padded) is None
    _checkpoint(canonical, step)
    _checkpoint(padded, step)  # a copy under a second name for the step: not the engine's
    assert ckpt.list_checkpoints(root.parent) == [canonical]
    assert ckpt.resolve_resume("latest", root.parent).path == canonical
