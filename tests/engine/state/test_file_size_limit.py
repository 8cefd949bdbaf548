"""A file-size limit (ulimit -f, RLIMIT_FSIZE) smaller than a file a command writes: one line naming the limit and
what to raise, before the work where the file's size is known (a run's checkpoints), and the user's earlier file
left whole. Before, the built-in model's save ended `train` with a 27-line safetensors traceback ("File too large
(os error 27)"), and other writes said "File too large" without naming the limit."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import main

ROOT = Path(__file__).parents[3]
KiB = 1024


@contextmanager
def _file_size_limit(limit: int):
    """The soft limit of this process, for the block (the hard one, and so the way back, unchanged)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limit=st.integers(1 * KiB, 12 * KiB), earlier=st.binary(min_size=1, max_size=512))
def test_a_plot_past_the_limit_is_one_line_naming_it_and_the_earlier_image_stays(limit, earlier, tmp_path, capsys):
    run_dir = tmp_path / f"run-{len(os.listdir(tmp_path))}"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward": s / 7, "kl": s / 9}) + "\n"
                                                   for s in range(1, 40)))
    (run_dir / "curves.png").write_bytes(earlier)
    with _file_size_limit(limit):
        code = main(["plot", str(run_dir)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert "ulimit -f" in lines[0] and f"{limit / KiB:.1f} KiB" in lines[0], lines[0]
    assert (run_dir / "curves.png").read_bytes() == earlier
    assert sorted(os.listdir(run_dir)) == ["curves.png", "metrics.jsonl"]  # no partial image beside it


@pytest.mark.slow
# two engine starts (about 15 s each on CI's two cores); each run draws fresh limits
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limit_kib=st.integers(4, 800))
def test_a_run_whose_checkpoints_would_not_fit_is_refused_before_its_first_save(limit_kib, tmp_path):
    run_dir = tmp_path / f"run-{limit_kib}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [sys.executable, "-m", "grpo_engine", "train", "--output-dir", str(run_dir), "--run.max_steps", "1",
         "--run.warm_start_steps", "0", "--run.progress_bar", "false"],
        env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit_kib * KiB, limit_kib * KiB)))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "ulimit -f" in lines[0] and "checkpoint files" in lines[0], lines[0]
    assert not run_dir.exists()  # a start that failed leaves nothing behind
