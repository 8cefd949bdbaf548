"""Checkpoints are atomic and pruned, and a resumed run continues exactly (mid-epoch and at an epoch end)."""

import errno
import json
import shutil
from pathlib import Path

import pytest
import torch
import user_rewards
from safetensors.torch import load_file

from grpo_engine.config import load_config
from grpo_engine.state import checkpoint as ckpt
from grpo_engine.trainer import train
from repo_paths import SUPPORT

NON_DETERMINISTIC = ("time/", "step_time", "tokens/s", "memory/")


def test_incomplete_and_temporary_checkpoints_are_ignored(tmp_path):
    root = ckpt.checkpoint_root(tmp_path)
    for name in ("checkpoint-000002", "checkpoint-000010", ".tmp-checkpoint-000012", "checkpoint-000011"):
        (root / name).mkdir(parents=True)
    for name in ("checkpoint-000002", "checkpoint-000010", ".tmp-checkpoint-000012"):
        (root / name / ckpt.STATE_FILE).write_text('{"step": %d, "sampler": {"epoch": 0, "offset": 0}}' % int(name[-6:]))
        ckpt.write_manifest(root / name)
    # checkpoint-000011 has no state file (a copy interrupted by hand): not a checkpoint either.
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["checkpoint-000002", "checkpoint-000010"]
    assert ckpt.resolve_resume("latest", tmp_path).path.name == "checkpoint-000010"
    with pytest.raises(ckpt.CheckpointError, match="no complete checkpoint"):
        ckpt.resolve_resume("latest", tmp_path / "elsewhere")


def _deterministic(rows):
    return [{k: v for k, v in row.items() if not k.startswith(NON_DETERMINISTIC)} for row in rows]


def _metrics(run_dir: Path):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _run(overrides: dict, run_dir: Path, max_steps: int, crash_at: int | None = None, resume: bool = False):
    user_rewards.calls["count"] = 0
    values = {**overrides, "run.output_dir": str(run_dir), "run.max_steps": max_steps, "run.save_steps": 1,
              "run.save_total_limit": 10, "optim.lr_scheduler_type": "linear",
              "rewards.functions": ["length", "user_rewards:crash_at_call"]}
    if resume:
        values["run.resume"] = "latest"
    import os

    os.environ["CRASH_AT_CALL"] = str(crash_at) if crash_at else ""
    try:
        train(load_config(overrides=values))
    finally:
        os.environ.pop("CRASH_AT_CALL", None)


@pytest.mark.slow
@pytest.mark.parametrize("prompts_per_step, stop_after, dtype", [
    (2, 4, "float32"),  # 9 prompts, 2 per step: the step after the checkpoint straddles the epoch boundary
    (3, 3, "float32"),  # 3 per step: the checkpoint is exactly at the end of the first epoch
    (2, 4, "bfloat16"),  # AdamW on float32 copies of the weights (optim.master_weights auto), restored in float32
])
def test_resume_continues_exactly(small_overrides, tmp_path, monkeypatch, prompts_per_step, stop_after, dtype):
    monkeypatch.syspath_prepend(str(SUPPORT))
    overrides = {**small_overrides, "optim.per_device_train_batch_size": 4 * prompts_per_step, "model.dtype": dtype}
    total = stop_after + 2
    _run(overrides, tmp_path / "straight", total)
    with pytest.raises(KeyboardInterrupt):
        # Reward call 1 is the evaluation before training, call k + 1 is step k.
        _run(overrides, tmp_path / "stopped", total, crash_at=stop_after + 2)
    assert ckpt.list_checkpoints(tmp_path / "stopped")[-1].name == f"checkpoint-{stop_after:06d}"
    _run(overrides, tmp_path / "stopped", total, resume=True)

    straight, resumed = _metrics(tmp_path / "straight"), _metrics(tmp_path / "stopped")
    assert _deterministic(resumed) == _deterministic(straight)
    epochs = [row["epoch"] for row in straight if "epoch" in row]
    assert epochs[stop_after - 1] <= 1.0 < epochs[stop_after]  # the run did cross the boundary here
    final = f"checkpoints/checkpoint-{total:06d}"
    a = load_file(tmp_path / "straight" / final / "model" / "model.safetensors")
    b = load_file(tmp_path / "stopped" / final / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    opt_a = torch.load(tmp_path / "straight" / final / "optimizer.pt", weights_only=False)["state"]
    opt_b = torch.load(tmp_path / "stopped" / final / "optimizer.pt", weights_only=False)["state"]
    assert all(torch.equal(opt_a[i]["exp_avg"], opt_b[i]["exp_avg"]) for i in opt_a)
    if dtype != "float32":  # the copies, saved and restored in float32, ahead of the rounded weights
        assert all(opt_b[i]["master"].dtype == torch.float32 and torch.equal(opt_a[i]["master"], opt_b[i]["master"])
                   for i in opt_a)
        assert any(not torch.equal(opt_b[i]["master"], opt_b[i]["master"].to(torch.bfloat16).float()) for i in opt_b)


@pytest.mark.slow
def test_keep_last_k_and_no_leftovers(small_overrides, tmp_path):
    overrides = {**small_overrides, "run.max_steps": 4, "run.save_steps": 1, "run.save_total_limit": 2}
    train(load_config(overrides=overrides))
    root = ckpt.checkpoint_root(tmp_path / "run")
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-000003", "checkpoint-000004"]
    state = json.loads((root / "checkpoint-000004" / ckpt.STATE_FILE).read_text())
    assert state["step"] == 4 and set(state["sampler"]) == {"epoch", "offset"}
    assert (root / "checkpoint-000004" / "model" / "config.json").is_file()  # HF format, loadable as a model
    assert (root / "checkpoint-000004" / "model" / "tokenizer.json").is_file()


@pytest.mark.slow
def test_a_fresh_run_refuses_a_directory_with_checkpoints(small_overrides):
    from grpo_engine.state.finished_run import RunFinished

    config = load_config(overrides={**small_overrides, "run.max_steps": 2, "run.save_steps": 1})
    train(config)
    with pytest.raises(RunFinished, match="holds this run, finished: step 2 of 2"):  # the same run: its report
        train(config)
    shutil.rmtree(ckpt.list_checkpoints(config.run.output_dir)[-1])  # as if stopped after step 1
    with pytest.raises(ckpt.CheckpointError, match="already holds checkpoints: pass --resume"):
        train(config)


# What a full disk raises, by writer (the messages of saves onto a full tmpfs): torch's zip writer reports only
# a short write, safetensors and Python's own writes say ENOSPC.
TORCH_SHORT_WRITE = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
DISK_FULL = {
    "torch.save": TORCH_SHORT_WRITE,
    "safetensors": RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)"),
    "open": OSError(errno.ENOSPC, "No space left on device"),
}


def _fail_in_second_checkpoint(monkeypatch, error: Exception) -> None:
    """Every write into .tmp-checkpoint-000002 fails with `error` once it has written part of a file."""
    real_save = torch.save

    def save(obj, file, *args, **kwargs):
        if ".tmp-checkpoint-000002" in str(file):
            Path(file).write_bytes(b"partial")
            raise error
        return real_save(obj, file, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


@pytest.mark.slow
@pytest.mark.parametrize("writer", list(DISK_FULL))
def test_a_full_disk_stops_cleanly_and_keeps_the_last_good_checkpoint(small_overrides, monkeypatch, writer):
    _fail_in_second_checkpoint(monkeypatch, DISK_FULL[writer])
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(2**30, 2**30, 0))  # full
    overrides = {**small_overrides, "run.max_steps": 3, "run.save_steps": 1}
    with pytest.raises(ckpt.CheckpointError) as exc:
        train(load_config(overrides=overrides))
    root = ckpt.checkpoint_root(overrides["run.output_dir"])
    assert str(exc.value).startswith(f"no space left on device while saving {root / 'checkpoint-000002'}")
    assert "the partial .tmp-checkpoint-000002 was removed" in str(exc.value)
    assert f"the last good checkpoint is {root / 'checkpoint-000001'}" in str(exc.value)
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-000001"]  # nothing partial left behind
    assert ckpt.checkpoint_problems(root / "checkpoint-000001") == []
    monkeypatch.undo()
    monkeypatch.syspath_prepend(str(SUPPORT))  # (undone with the rest)
    train(load_config(overrides={**overrides, "run.resume": "latest"}))  # space freed: it goes on from there
    assert [p.name for p in ckpt.list_checkpoints(root.parent)][-1] == "checkpoint-000003"


@pytest.mark.slow
def test_another_save_failure_is_not_called_a_full_disk_but_still_cleans_up(small_overrides, monkeypatch):
    # torch's short write with space left on the disk (an I/O error): not a full disk
    _fail_in_second_checkpoint(monkeypatch, TORCH_SHORT_WRITE)
    overrides = {**small_overrides, "run.max_steps": 3, "run.save_steps": 1}
    with pytest.raises(RuntimeError, match="unexpected pos") as exc:
        train(load_config(overrides=overrides))
    assert not isinstance(exc.value, ckpt.CheckpointError)
    root = ckpt.checkpoint_root(overrides["run.output_dir"])
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-000001"]
