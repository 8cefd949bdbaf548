"""`--resume DIR` naming something other than a checkpoint: the directory a user sees (the run directory, its
checkpoints/, a checkpoint's model/ or another of its folders), a path relative to the run directory typed from
another working directory, a file, or a save that never completed. Each is one line saying what it is and what to
name instead, before anything is removed or loaded. Before, all were "is not a checkpoint directory (no
trainer_state.json)" after the imports, even for a path that does not exist, and a partial save named there was
removed first (so the message named a file the user had just seen)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.state import checkpoint as ckpt

ROOT = Path(__file__).parents[3]


def _run_dir(base: Path, steps: tuple[int, ...]) -> Path:
    run_dir = base / "run"
    for step in steps:
        checkpoint = run_dir / "checkpoints" / f"checkpoint-{step:06d}"
        (checkpoint / "model").mkdir(parents=True)
        (checkpoint / "trainer_state.json").write_text(json.dumps({"step": step}))
    return run_dir


def _named(kind: str, run_dir: Path, newest: Path, inner: str) -> tuple[str, str]:
    """(the value given to --resume, the words its refusal must hold)."""
    if kind == "run directory":
        return str(run_dir), f"its newest: {newest}"
    if kind == "checkpoints/":
        return str(run_dir / "checkpoints"), f"its newest: {newest}"
    if kind == "inside a checkpoint":
        (newest / inner).mkdir(exist_ok=True)
        return str(newest / inner), f"inside the checkpoint {newest}"
    if kind == "relative to the run directory":
        return os.path.relpath(newest, run_dir), f"did you mean {newest}?"
    if kind == "missing":
        return str(run_dir / "checkpoints" / "checkpoint-999999"), "does not exist"
    if kind == "a file":
        (run_dir / inner).write_text("notes\n")
        return str(run_dir / inner), "is a file"
    partial = run_dir / "checkpoints" / ".tmp-checkpoint-999999"  # a save stopped while written
    partial.mkdir(exist_ok=True)
    (partial / "trainer_state.json").write_text(json.dumps({"step": 999999}))
    return str(partial), "never completed"


KINDS = ("run directory", "checkpoints/", "inside a checkpoint", "relative to the run directory", "missing", "a file",
         "partial save")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), steps=st.sets(st.integers(1, 50), min_size=1, max_size=3).map(tuple),
       inner=st.sampled_from(["model", "history", "sharded", "notes"]))
def test_a_resume_naming_no_checkpoint_says_what_it_names_and_removes_nothing(kind, steps, inner, tmp_path_factory,
                                                                              monkeypatch):
    base = tmp_path_factory.mktemp("resume")
    run_dir = _run_dir(base, steps)
    newest = run_dir / "checkpoints" / f"checkpoint-{max(steps):06d}"
    monkeypatch.chdir(base)  # a relative value is read from here, not from the run directory
    value, words = _named(kind, run_dir, newest, inner)
    before = sorted(str(p) for p in run_dir.rglob("*"))
    with pytest.raises(ckpt.CheckpointError) as refused:
        ckpt.resolve_resume(value, run_dir)
    message = str(refused.value)
    assert "\n" not in message and f"--resume {value!r}" in message and words in message, message
    assert sorted(str(p) for p in run_dir.rglob("*")) == before  # the partial save named is still there


def test_the_cli_says_it_before_any_import(tmp_path):
    run_dir = _run_dir(tmp_path, (2,))
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "grpo_engine", "train", "--output-dir",
                             str(run_dir), "--resume", str(run_dir)], capture_output=True, text=True, timeout=120,
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert errors == [f"grpo-engine train: CheckpointError: run.resume / --resume {str(run_dir)!r} is a run's "
                      f"directory, not one checkpoint (its newest: {run_dir / 'checkpoints' / 'checkpoint-000002'}); "
                      f"name a checkpoint, or give --resume with no value and --output-dir for the run's newest "
                      f"intact one"], result.stderr[-2000:]
    assert "| torch\n" not in result.stderr  # refused before torch's seconds of import
