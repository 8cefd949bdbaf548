"""What a resume may meet besides its own run directory as it left it: another run's checkpoint named with --resume
DIR into a directory that holds a run of its own (before: that run's later checkpoints were re-saved from the other
run's weights and its metrics merged into steps [1, 1, 2, ...]), another number of processes than the checkpoint was
saved by (before: 2 processes' checkpoint resumed by 1 trained on silently with half the batch; 1 process's by 2 failed
on one rank while the other printed gloo's "Connection closed by peer"), and a run directory named relative to
another working directory (before: "has no complete checkpoint (the run stopped before its first save?)" for a
directory that held no run at all)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import main
from grpo_engine.state import checkpoint as ckpt
from grpo_engine.state.resume import check_resumes_its_own

from processes import subprocess_env, torchrun
from repo_paths import ROOT


def _checkpoint(path: Path, step: int, processes: int = 1) -> Path:
    path.mkdir(parents=True)
    (path / ckpt.STATE_FILE).write_text(json.dumps({"step": step}))
    for process in range(processes):
        (path / f"rng-{process}.pt").write_bytes(b"")
    return path


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(saved=st.integers(1, 5), now=st.integers(1, 5))
def test_a_checkpoint_resumes_with_the_processes_that_saved_it(saved, now, tmp_path_factory):
    path = _checkpoint(tmp_path_factory.mktemp("run") / "checkpoint-000003", 3, saved)
    (path / "rng-x.pt").write_bytes(b"")  # not a process's file
    if saved == now:
        ckpt.check_saved_processes(path, now)
        return
    with pytest.raises(ckpt.CheckpointError) as refused:
        ckpt.check_saved_processes(path, now)
    message = str(refused.value)
    assert "\n" not in message and f"saved by {saved} data-parallel process" in message and f"has {now}:" in message
    assert f"--nproc_per_node {saved}" in message and "another --output-dir" in message


WHERE = st.sampled_from(["own", "own copy", "linked", "other run", "loose"])
HOLDS = st.sets(st.sampled_from(["checkpoints", "metrics", "empty metrics", "notes"]))


@settings(max_examples=60, deadline=None)
@given(where=WHERE, holds=HOLDS, step=st.integers(1, 50))
def test_another_runs_checkpoint_resumes_only_into_a_directory_without_a_run(where, holds, step, tmp_path_factory):
    base = tmp_path_factory.mktemp("place")
    run_dir = base / "run"
    run_dir.mkdir()
    if "checkpoints" in holds:
        _checkpoint(run_dir / "checkpoints" / f"checkpoint-{step + 1:06d}", step + 1)
    if "metrics" in holds:
        (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    elif "empty metrics" in holds:
        (run_dir / "metrics.jsonl").write_text("")
    if "notes" in holds:
        (run_dir / "notes.txt").write_text("mine")
    name = f"checkpoint-{step:06d}"
    path = {"own": run_dir / "checkpoints" / name, "own copy": run_dir / "checkpoints" / f"{name}-keep",
            "linked": base / "other-disk" / name, "other run": base / "other" / "checkpoints" / name,
            "loose": base / "downloads" / name}[where]
    _checkpoint(path, step)
    if where == "linked":  # moved to another disk by its user and linked back
        (run_dir / "checkpoints").mkdir(exist_ok=True)
        (run_dir / "checkpoints" / name).symlink_to(path, target_is_directory=True)
    point = ckpt.ResumePoint(path, step, [])
    foreign = where in ("other run", "loose")
    holds_a_run = "checkpoints" in holds or "metrics" in holds
    if not (foreign and holds_a_run):
        check_resumes_its_own(point, run_dir)
        return
    with pytest.raises(ckpt.CheckpointError) as refused:
        check_resumes_its_own(point, run_dir)
    message = str(refused.value)
    assert "\n" not in message and f"cannot resume {path} in {run_dir}: it is another run directory's" in message
    assert ("checkpoints up to step" in message) == ("checkpoints" in holds) and "empty --output-dir" in message


def test_latest_in_a_directory_without_checkpoints_names_it_and_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ckpt.CheckpointError) as refused:
        ckpt.resolve_resume("latest", "runs/typo")
    message = str(refused.value)
    assert f"{tmp_path / 'runs' / 'typo'} holds no checkpoints/" in message
    assert f"read from the working directory {tmp_path}" in message and "--output-dir" in message


def _fails_in_one_line(capsys, args: list[str], expected: str) -> str:
    code = main(args)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and expected in lines[0], lines
    return lines[0]


ON_MODEL = ["--run.progress_bar", "false", "--run.plot", "false", "--rollout.num_generations", "4",
            "--rollout.max_new_tokens", "6", "--optim.per_device_train_batch_size", "8",
            "--run.log_completions_steps", "0", "--run.loss_backend", "torch", "--rewards.functions", "[math_accuracy]",
            "--run.save_steps", "1"]


def test_another_runs_checkpoint_is_refused_into_a_run_and_forks_into_an_empty_directory(tiny_model_dir, tmp_path,
                                                                                        capsys):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(4)))
    common = ["train", "--model", str(tiny_model_dir), "--data", str(data), *ON_MODEL]
    first, second, fork = tmp_path / "first", tmp_path / "second", tmp_path / "fork"
    assert main([*common, "--output-dir", str(first), "--run.max_steps", "1"]) == 0
    assert main([*common, "--output-dir", str(second), "--run.max_steps", "2"]) == 0
    before = {p.name: (p / ckpt.MANIFEST_FILE).read_text() for p in ckpt.list_checkpoints(second)}
    metrics = (second / "metrics.jsonl").read_text()
    capsys.readouterr()
    theirs = first / "checkpoints" / "checkpoint-000001"
    _fails_in_one_line(capsys, [*common, "--output-dir", str(second), "--run.max_steps", "3", "--resume", str(theirs)],
                       f"cannot resume {theirs} in {second}: it is another run directory's checkpoint")
    assert {p.name: (p / ckpt.MANIFEST_FILE).read_text() for p in ckpt.list_checkpoints(second)} == before
    assert (second / "metrics.jsonl").read_text() == metrics
    assert main([*common, "--output-dir", str(fork), "--run.max_steps", "2", "--resume", str(theirs)]) == 0
    out = capsys.readouterr().out
    lines = (fork / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines if '"reward"' in line]
    assert steps == [1, 2]
    # the summary names what the run directory holds: no curves.png with run.plot false
    assert f"run directory: {fork} (metrics.jsonl, samples.jsonl, checkpoints/)" in out


def test_a_checkpoint_of_two_processes_is_not_resumed_by_one(tiny_model_dir, tmp_path, capsys):
    """The checkpoint as 2 processes save it (rng-0.pt and rng-1.pt, in its manifest): one process refuses it before
    any weight loads, and it stays as it was."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(4)))
    common = ["train", "--model", str(tiny_model_dir), "--data", str(data), *ON_MODEL,
              "--output-dir", str(tmp_path / "run")]
    assert main([*common, "--run.max_steps", "1"]) == 0
    saved = tmp_path / "run" / "checkpoints" / "checkpoint-000001"
    (saved / "rng-1.pt").write_bytes((saved / "rng-0.pt").read_bytes())
    ckpt.write_manifest(saved)
    capsys.readouterr()
    _fails_in_one_line(capsys, [*common, "--run.max_steps", "2", "--resume"],
                       f"cannot resume {saved}: it was saved by 2 data-parallel processes")
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "run")] == ["checkpoint-000001"]


@pytest.mark.slow
def test_a_checkpoint_of_one_process_is_refused_by_each_of_two(tmp_path):
    """1 process's checkpoint resumed under torchrun by 2: the same line on each process, no gloo text."""
    flags = ["--run.progress_bar", "false", "--run.plot", "false", "--run.warm_start_steps", "0",
             "--data.builtin_max_operand", "2", "--data.builtin_eval_size", "0", "--rollout.num_generations", "4",
             "--rollout.max_new_tokens", "4", "--optim.per_device_train_batch_size", "4", "--run.save_steps", "1",
             "--run.log_completions_steps", "0", "--run.loss_backend", "torch", "--output-dir", str(tmp_path / "run")]
    assert main(["train", *flags, "--run.max_steps", "1"]) == 0  # here: one engine start fewer
    done = subprocess.run(torchrun("-m", "grpo_engine", "train", *flags, "--run.max_steps", "2", "--resume"),
                          env=subprocess_env(), cwd=ROOT, capture_output=True, text=True, timeout=240)
    # each process's line, wherever it starts: two processes writing to one pipe may interleave their lines
    ours = re.findall(r"grpo-engine train: [^\n]*?--output-dir", done.stderr)
    assert done.returncode != 0 and len(ours) == 2 and len(set(ours)) == 1, done.stderr[-3000:]
    assert "saved by 1 data-parallel process" in ours[0] and "has 2:" in ours[0], ours[0]
    assert "gloo" not in done.stderr
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "run")] == ["checkpoint-000001"]
