"""A checkpoint save whose process is killed with SIGKILL while writing (no handler runs: the partial
.tmp-checkpoint-N stays): `--resume` takes the last complete checkpoint, names the partial one in a warning and
removes it (it only held disk space). Before, it was passed over in silence and stayed until a save of that step."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.state import checkpoint as ckpt

from repo_paths import ROOT

CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from grpo_engine.state import checkpoint as ckpt

    run_dir, step, files, written = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

    def killed_while_writing(accelerator, run_dir, step, *args, **kwargs):
        tmp = ckpt.temporary_dir(run_dir, step)
        (tmp / "model").mkdir(parents=True)
        for i in range(files):
            (tmp / "model" / f"part-{i}.bin").write_bytes(b"x" * written)
        os.kill(os.getpid(), signal.SIGKILL)

    ckpt._write_checkpoint = killed_while_writing
    ckpt.save_checkpoint(None, run_dir, step)
""")


def _complete_checkpoint(directory: Path, step: int) -> None:
    directory.mkdir(parents=True)
    (directory / ckpt.STATE_FILE).write_text(json.dumps({"step": step, "sampler": {"epoch": 0, "offset": 0}}))
    ckpt.write_manifest(directory)


def _kill_a_save_midway(run_dir: Path, step: int, files: int, written: int) -> Path:
    """Run a save in a child process that SIGKILLs itself while writing; the partial directory it leaves."""
    child = subprocess.run([sys.executable, "-c", CHILD, str(run_dir), str(step), str(files), str(written)],
                           cwd=ROOT, capture_output=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    partial = ckpt.temporary_dir(run_dir, step)
    assert partial.is_dir()
    return partial


def _assert_resumes_from_the_last_complete(run_dir: Path, earlier: list[int], partial: Path) -> None:
    point = ckpt.resolve_resume("latest", run_dir)
    assert point.step == max(earlier) and not partial.exists()
    assert len(point.skipped) == 1 and str(partial) in point.skipped[0] and "\n" not in point.skipped[0]


def test_resume_after_a_save_killed_midway(tmp_path):
    """The real thing once: a process killed with SIGKILL inside a save (a child process; ~10 s of imports)."""
    earlier = [3, 7]
    for step in earlier:
        _complete_checkpoint(ckpt.checkpoint_root(tmp_path) / f"checkpoint-{step:06d}", step)
    partial = _kill_a_save_midway(tmp_path, max(earlier) + 1, files=2, written=1000)
    _assert_resumes_from_the_last_complete(tmp_path, earlier, partial)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(earlier=st.lists(st.integers(1, 20), min_size=1, max_size=3, unique=True), files=st.integers(0, 3),
       written=st.integers(0, 4096))
def test_resume_after_any_partial_save(earlier, files, written, tmp_path_factory):
    """What such a kill leaves, drawn: the partial directory of the next step with some of its files written."""
    run_dir = tmp_path_factory.mktemp("run")
    for step in earlier:
        _complete_checkpoint(ckpt.checkpoint_root(run_dir) / f"checkpoint-{step:06d}", step)
    partial = ckpt.temporary_dir(run_dir, max(earlier) + 1)
    (partial / "model").mkdir(parents=True)
    for i in range(files):
        (partial / "model" / f"part-{i}.bin").write_bytes(b"x" * written)
    _assert_resumes_from_the_last_complete(run_dir, earlier, partial)
