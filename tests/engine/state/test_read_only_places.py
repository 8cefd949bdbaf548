"""Run directories, their checkpoints/ and plot / eval outputs on a read-only filesystem (a tmpfs remounted
read-only; needs root, skipped without it): one line naming the path, before any step. Before, a checkpoints/
linked to a read-only disk failed at the first save, after its steps, and `plot` drew the figure first."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from grpo_engine.cli import main


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def read_only(tmp_path_factory):
    """(a read-only directory holding a run directory `run`, a writable scratch directory)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a read-only filesystem needs root")
    place, scratch = tmp_path_factory.mktemp("ro"), tmp_path_factory.mktemp("rw")
    if not _mount("-t", "tmpfs", "-o", "size=4m", "tmpfs", str(place)):
        pytest.skip("cannot mount a tmpfs here")
    try:
        run = place / "run"
        (run / "checkpoints" / "checkpoint-000001").mkdir(parents=True)
        (run / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
        (run / ".grpo-engine.lock").write_text("")
        assert _mount("-o", "remount,ro", str(place))
        yield place, scratch
    finally:
        subprocess.run(["umount", str(place)], check=True)


def _one_line(capsys, *named: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Read-only file system" in err[0] and all(name in err[0] for name in named), err
    return err[0]


@pytest.mark.parametrize("resume", [True, False])
def test_a_run_directory_on_a_read_only_filesystem(read_only, resume, capsys):
    place, _ = read_only
    output = place / ("run" if resume else "new")
    assert main(["train", "--output-dir", str(output), "--run.max_steps", "3"] + ["--resume"] * resume) == 1
    _one_line(capsys, str(output))


def test_checkpoints_linked_to_a_read_only_disk(read_only, capsys):
    place, scratch = read_only
    run = scratch / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(place / "run" / "checkpoints")
    assert main(["train", "--output-dir", str(run), "--run.max_steps", "3", "--resume"]) == 1
    _one_line(capsys, "checkpoints")


@pytest.mark.parametrize("command", [["plot", "RUN"], ["plot", "RUN", "--output", "RUN/c.png"],
                                     ["eval", "--model", "org/model", "--output", "RUN/out.json"]])
def test_outputs_on_a_read_only_filesystem_are_named_before_any_work(read_only, command, capsys):
    place, _ = read_only
    argv = [a.replace("RUN", str(place / "run")) for a in command]
    assert main(argv) == 1
    _one_line(capsys, str(place / "run"))
