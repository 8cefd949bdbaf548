"""A checkpoint save stopped anywhere: by Ctrl-C (a second one, during the save), SIGTERM's SystemExit, a full
disk or another error at a drawn point of its writing, or between the two renames of a re-save of the same step.
The partial directory never stays behind, the earlier checkpoints are untouched, and `--resume` (latest) finds
the newest complete checkpoint, the re-saved step's included. Before, a KeyboardInterrupt left
.tmp-checkpoint-N behind (on a full disk, keeping it full), and a re-save stopped between its renames hid
checkpoint-N as .old-checkpoint-N, so the run resumed from an earlier step."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.state import checkpoint as ckpt

ERRORS = {"Ctrl-C": KeyboardInterrupt, "SIGTERM": lambda: SystemExit(143),
          "full disk": lambda: OSError(errno.ENOSPC, "No space left on device"),
          "i/o error": lambda: OSError(errno.EIO, "Input/output error"), "bug": lambda: RuntimeError("boom")}


def _complete_checkpoint(directory: Path, step: int, payload: bytes) -> None:
    directory.mkdir(parents=True)
    (directory / ckpt.STATE_FILE).write_text(json.dumps({"step": step, "sampler": {"epoch": 0, "offset": 0}}))
    (directory / "weights.bin").write_bytes(payload)
    ckpt.write_manifest(directory)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(earlier=st.lists(st.integers(1, 50), min_size=0, max_size=3, unique=True), files=st.integers(0, 4),
       written=st.integers(0, 3000), error=st.sampled_from(sorted(ERRORS)))
def test_a_save_stopped_while_writing_leaves_no_partial_checkpoint(earlier, files, written, error, tmp_path_factory,
                                                                   monkeypatch):
    run_dir = tmp_path_factory.mktemp("run")
    for step in earlier:
        _complete_checkpoint(ckpt.checkpoint_root(run_dir) / f"checkpoint-{step:06d}", step, bytes([step]) * 64)
    before = _snapshot(run_dir)
    step = max(earlier, default=0) + 1

    def stopped_write(accelerator, run_dir, step, *args, **kwargs):
        tmp = ckpt.temporary_dir(run_dir, step)
        tmp.mkdir(parents=True)
        for i in range(files):
            (tmp / f"part-{i}.bin").write_bytes(b"x" * written)
        raise ERRORS[error]()

    monkeypatch.setattr(ckpt, "_write_checkpoint", stopped_write)
    expected = ckpt.CheckpointError if error == "full disk" else type(ERRORS[error]())
    with pytest.raises(expected) as raised:
        ckpt.save_checkpoint(None, run_dir, step)
    if error == "full disk":
        assert "\n" not in str(raised.value) and "was removed" in str(raised.value)
    assert _snapshot(run_dir) == before
    assert not ckpt.temporary_dir(run_dir, step).exists()
    newest = ckpt.resolve_resume("latest", run_dir).path.name if earlier else None
    assert newest == (f"checkpoint-{max(earlier):06d}" if earlier else None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(earlier=st.lists(st.integers(1, 20), max_size=3, unique=True), step=st.integers(21, 40),
       stop=st.sampled_from(["after the first rename", "after both renames", "while removing the old copy"]),
       removed=st.integers(0, 3))
def test_a_resave_stopped_between_its_renames_resumes_from_that_step(earlier, step, stop, removed, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    root = ckpt.checkpoint_root(run_dir)
    for s in earlier:
        _complete_checkpoint(root / f"checkpoint-{s:06d}", s, b"e" * 32)
    final, stale, tmp = root / f"checkpoint-{step:06d}", ckpt.stale_dir(run_dir, step), ckpt.temporary_dir(run_dir, step)
    _complete_checkpoint(stale, step, b"old copy")  # checkpoint-N as the re-save's first rename left it
    _complete_checkpoint(tmp, step, b"new copy")
    if stop != "after the first rename":
        tmp.rename(final)
    if stop == "while removing the old copy":
        for path in sorted(stale.iterdir())[:removed]:
            path.unlink()
    point = ckpt.resolve_resume("latest", run_dir)
    assert point.path == final and ckpt.checkpoint_problems(final) == []
    assert (final / "weights.bin").read_bytes() == (b"old copy" if stop == "after the first rename" else b"new copy")
    assert not stale.exists()
