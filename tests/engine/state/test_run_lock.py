"""One run per run directory: a second run is refused at once naming the holder, a killed run's hold is taken
over, and an output directory that cannot hold a run is refused in one line before anything loads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_engine.state.run_lock import LOCK_FILE, RunDirectoryError, RunLock, check_output_dir, hold_run_directory

ROOT = Path(__file__).parents[3]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")


def _holder(run_dir: Path) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, str(ROOT / "tests" / "support" / "hold_run_dir.py"), str(run_dir)],
                               stdout=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    assert process.stdout.readline().strip() == "held"
    return process


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_engine", *args], capture_output=True, text=True, timeout=120,
                          env=ENV, cwd=ROOT)


def _one_line(result: subprocess.CompletedProcess, command: str = "train") -> str:
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert result.stderr.startswith(f"grpo-engine {command}: ")
    return result.stderr


@pytest.mark.slow
def test_a_second_run_on_a_held_directory_is_refused_naming_the_holder(tmp_path):
    run_dir = tmp_path / "run"
    holder = _holder(run_dir)
    try:
        (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
        result = _cli("train", "--output-dir", str(run_dir), "--resume", "--run.progress_bar", "false")
        message = _one_line(result)
        assert f"is in use by another run (process {holder.pid} on " in message
        assert (run_dir / "metrics.jsonl").read_text() == '{"step": 1}\n'  # untouched
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_runs_hold_is_taken_over_with_a_note(tmp_path, capsys):
    run_dir = tmp_path / "run"
    holder = _holder(run_dir)
    with pytest.raises(RunDirectoryError, match=f"process {holder.pid} "):
        RunLock.acquire(run_dir)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    lock = RunLock.acquire(run_dir)
    assert f"held by a run that ended without releasing it (process {holder.pid} " in capsys.readouterr().err
    assert f"process {os.getpid()} " in (run_dir / LOCK_FILE).read_text()
    lock.release()
    assert (run_dir / LOCK_FILE).read_text() == ""  # released: the next run takes it without a note
    RunLock.acquire(run_dir).release()
    assert capsys.readouterr().err == ""


def test_the_hold_lasts_the_context_and_a_directory_it_made_for_nothing_goes(tmp_path):
    run_dir = tmp_path / "new" / "run"
    with hold_run_directory(run_dir):
        with pytest.raises(RunDirectoryError, match="in use by another run"):
            RunLock.acquire(run_dir)
    assert not (tmp_path / "new").exists()  # a run that stopped before writing leaves nothing
    with hold_run_directory(run_dir):
        (run_dir / "metrics.jsonl").write_text("")
    assert (run_dir / "metrics.jsonl").is_file()


def _read_only_dir(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        path = tmp_path / "read_only"
        path.mkdir()
        path.chmod(0o555)
        return path
    try:  # root writes through mode bits; a read-only mount stops it
        check_output_dir("/sys/grpo-run")
    except RunDirectoryError:
        return Path("/sys")
    pytest.skip("running as root with no read-only filesystem to write to")


@pytest.mark.parametrize("case", ["a file", "under a file", "read-only"])
def test_an_output_directory_that_cannot_hold_a_run_is_one_line_before_anything_loads(case, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("keep me")
    output = {"a file": a_file, "under a file": a_file / "run",
              "read-only": _read_only_dir(tmp_path) / "run"}[case]
    expected = {"a file": "is a file, not a directory", "under a file": "which is a file",
                "read-only": "is not writable"}[case]
    result = _cli("train", "--output-dir", str(output), "--run.progress_bar", "false")
    assert expected in _one_line(result)
    assert a_file.read_text() == "keep me"


def test_eval_output_that_is_a_directory_is_refused_before_the_evaluation(tmp_path):
    result = _cli("eval", "--model", str(tmp_path), "--output", str(tmp_path))
    assert "--output" in _one_line(result, "eval") and "is a directory" in result.stderr
