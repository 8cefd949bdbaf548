"""Rotation (run.save_total_limit) that cannot delete an old checkpoint: a file another user owns, an immutable
one, a busy one on NFS, a read-only disk under a linked checkpoint. The new checkpoint is already saved; the run
goes on with one warning naming the checkpoint, the file and the reason. Before, the run ended with exit 1 after its
last save, saying only `PermissionError: [Errno 1] Operation not permitted: 'trainer_state.json'`."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.state import checkpoint as ckpt

FILES = ("trainer_state.json", "optimizer.pt", "scheduler.pt", "rng-0.pt", "model/model.safetensors",
         "history/metrics.jsonl")


def _checkpoint(root: Path, step: int) -> Path:
    path = root / "checkpoints" / f"checkpoint-{step:06d}"
    for name in FILES:
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(name)
    return path


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(code=st.sampled_from([errno.EPERM, errno.EACCES, errno.EBUSY, errno.EROFS, errno.EIO]),
       stuck=st.sampled_from(FILES))
def test_an_old_checkpoint_that_cannot_be_removed_is_a_warning_and_the_run_goes_on(code, stuck, tmp_path_factory,
                                                                                   monkeypatch, caplog):
    path = _checkpoint(tmp_path_factory.mktemp("run"), 1)
    unlink = os.unlink

    def refusing_unlink(name, *args, **kwargs):  # the filesystem refusing one file, as shutil.rmtree meets it
        if os.fspath(name) == Path(stuck).name:
            raise OSError(code, os.strerror(code), os.fspath(name))
        return unlink(name, *args, **kwargs)

    caplog.clear()
    with monkeypatch.context() as patch, caplog.at_level(logging.WARNING):
        patch.setattr(os, "unlink", refusing_unlink)
        ckpt.remove_checkpoint(path)  # raised, ending the run after its newest checkpoint was saved
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert f"could not remove {path} ({Path(stuck).name}: {os.strerror(code)})" in warnings[0]
    assert (path / stuck).is_file()  # what could not be removed is where it was


def test_a_checkpoint_that_can_be_removed_goes_without_a_word(tmp_path, caplog):
    path = _checkpoint(tmp_path, 1)
    with caplog.at_level(logging.WARNING):
        ckpt.remove_checkpoint(path)
    assert not path.exists() and not caplog.records
