"""A run directory deleted, moved or replaced while the run trains: the run stops at the next step boundary on one
line saying so, writes nothing at that name, and does not claim a finished run. Before, it went on: it wrote its
next checkpoints and logs into a directory of that name made anew (or into a stranger's directory put there), and
ended with exit status 0 and a summary naming a directory that did not hold its run."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import main
from grpo_engine.state.run_lock import LOCK_FILE, RunLock

SUPPORT = Path(__file__).parents[2] / "support"
ACTIONS = ["delete", "rename", "replace with an empty directory", "replace with a copy"]


def _act(run_dir: Path, action: str) -> None:
    moved = run_dir.with_name(run_dir.name + "-moved")
    if action == "delete":
        shutil.rmtree(run_dir)
    elif action == "rename":
        run_dir.rename(moved)
    elif action == "replace with an empty directory":
        run_dir.rename(moved)
        run_dir.mkdir()
    elif action == "replace with a copy":  # the same names and contents, another directory
        shutil.copytree(run_dir, run_dir.with_name("copy"))
        run_dir.rename(moved)
        run_dir.with_name("copy").rename(run_dir)
    elif action == "lock file replaced":
        (run_dir / LOCK_FILE).unlink()
        (run_dir / LOCK_FILE).write_text("")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(action=st.sampled_from([*ACTIONS, "lock file replaced", "nothing", "files written in it"]),
       files=st.lists(st.sampled_from(["metrics.jsonl", "config.yaml", "checkpoints"]), unique=True))
def test_the_held_directory_is_in_place_until_its_path_leads_elsewhere(action, files, tmp_path):
    root = Path(os.path.realpath(tmp_path)) / f"case-{uuid.uuid4().hex[:12]}"  # unique: examples delete theirs
    run_dir = root / "run"
    lock = RunLock.acquire(run_dir)
    try:
        for name in files:
            (run_dir / name).mkdir() if name == "checkpoints" else (run_dir / name).write_text("kept\n")
        assert lock.in_place()
        if action == "files written in it":
            (run_dir / "samples.jsonl").write_text("{}\n")
        else:
            _act(run_dir, action)
        assert lock.in_place() == (action in ("nothing", "files written in it"))
        if not lock.in_place():
            assert "deleted, moved or replaced" in str(lock.moved(3)) and "after step 3" in str(lock.moved(3))
    finally:
        lock.release()


SMALL = ["--run.warm_start_steps", "0", "--run.progress_bar", "false", "--run.plot", "false",
         "--data.builtin_max_operand", "2", "--data.builtin_eval_size", "2", "--rollout.num_generations", "4",
         "--rollout.max_new_tokens", "4", "--optim.per_device_train_batch_size", "8",
         "--run.log_completions_steps", "0", "--run.loss_backend", "torch", "--run.save_steps", "1"]


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(action=st.sampled_from(ACTIONS), at_call=st.integers(1, 3))
def test_a_run_whose_directory_is_moved_stops_in_one_line_and_writes_nothing_there(action, at_call, tmp_path,
                                                                                monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(SUPPORT))
    # a name no earlier example used: the reward counts its calls per run directory, and a deleted directory's name
    # counted by what is left in tmp_path came round again (its calls already past MOVED_AT_CALL: nothing moved)
    run_dir = Path(os.path.realpath(tmp_path)) / f"run-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("MOVED_RUN_DIR", str(run_dir))
    monkeypatch.setenv("MOVED_RUN_DIR_ACTION", action)
    monkeypatch.setenv("MOVED_AT_CALL", str(at_call))  # 1: while the evaluation before training is scored
    code = main(["train", "--output-dir", str(run_dir), *SMALL, "--run.max_steps", "3",
                 "--rewards.functions", "[moving_rewards:moves_the_run_directory]"])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert "was deleted, moved or replaced while the run trained" in lines[0], lines[0]
    assert "run directory:" not in out  # no summary of a run that is not there
    left_there = {"delete": None, "rename": None, "replace with an empty directory": [],
                  "replace with a copy": "the copy"}[action]
    if left_there is None:
        assert not run_dir.exists()
    elif left_there == []:
        assert os.listdir(run_dir) == []  # a stranger's directory: nothing written into it
    else:
        moved = run_dir.with_name(run_dir.name + "-moved")
        assert sorted(os.listdir(run_dir)) == sorted(os.listdir(moved))
