"""An entry of checkpoints/ with a checkpoint's name (checkpoint-NNNNNN, or its .tmp- / .old- forms) that is not a
directory: a user's file, a dangling link, a link to a file, a FIFO. Resume and save name it in one line before any
step, and leave it as it was. Before, `--resume` said "no complete checkpoint" without naming it, a save of that
step failed after the step (a dangling link), and a re-save moved a user's file aside and then failed to delete it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import main
from grpo_engine.state import checkpoint as ckpt
from grpo_engine.state.run_lock import RunDirectoryError, check_run_entries


def _file(path: Path) -> None:
    path.write_text("a user's notes\n")


def _dangling(path: Path) -> None:
    path.symlink_to(path.parent.parent / "gone-elsewhere")


def _link_to_file(path: Path) -> None:
    target = path.parent.parent / f"user-{path.name}"
    target.write_text("a user's file\n")
    path.symlink_to(target)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


KINDS = {"file": (_file, "is not a directory"), "dangling link": (_dangling, "which does not exist"),
         "link to a file": (_link_to_file, "is a link to a file"), "fifo": (_fifo, "is not a directory")}


def _complete_checkpoint(directory: Path, step: int) -> None:
    directory.mkdir(parents=True)
    (directory / ckpt.STATE_FILE).write_text(json.dumps({"step": step, "sampler": {"epoch": 0, "offset": 0}}))
    ckpt.write_manifest(directory)


def _entries(run_dir: Path) -> dict[str, tuple[bool, str]]:
    return {str(p.relative_to(run_dir)): (p.is_symlink(), os.readlink(p) if p.is_symlink() else
                                          p.read_text() if p.is_file() else "")
            for p in sorted(run_dir.rglob("*"))}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(sorted(KINDS)), step=st.integers(0, 10**7), form=st.sampled_from(["", ".tmp-", ".old-"]),
       earlier=st.lists(st.integers(1, 30), max_size=2, unique=True))
def test_an_entry_of_a_checkpoints_name_that_is_no_directory_is_named_and_kept(kind, step, form, earlier,
                                                                                tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    root = ckpt.checkpoint_root(run_dir)
    root.mkdir()
    for s in earlier:
        if s != step:
            _complete_checkpoint(root / f"checkpoint-{s:06d}", s)
    entry = root / f"{form}checkpoint-{step:06d}"
    make, expected = KINDS[kind]
    make(entry)
    before = _entries(run_dir)
    for check in (lambda: check_run_entries(run_dir), lambda: ckpt.resolve_resume("latest", run_dir)):
        with pytest.raises(RunDirectoryError) as raised:
            check()
        message = str(raised.value)
        assert "\n" not in message and str(entry) in message and expected in message
    assert _entries(run_dir) == before


@pytest.mark.parametrize("kind", ["dir", "link to a dir"])
def test_checkpoints_that_are_directories_or_links_to_them_are_accepted(kind, tmp_path):
    run_dir = tmp_path / "run"
    elsewhere = tmp_path / "disk" / "checkpoint-000002"
    _complete_checkpoint(elsewhere, 2)
    entry = ckpt.checkpoint_root(run_dir) / "checkpoint-000002"
    entry.parent.mkdir(parents=True)
    entry.symlink_to(elsewhere) if kind == "link to a dir" else elsewhere.rename(entry)
    check_run_entries(run_dir)
    assert ckpt.resolve_resume("latest", run_dir).step == 2


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("resume", [True, False])
def test_the_cli_names_the_entry_before_any_work(kind, resume, tmp_path, capsys):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    entry = run_dir / "checkpoints" / "checkpoint-000001"
    KINDS[kind][0](entry)
    before = _entries(run_dir)
    assert main(["train", "--output-dir", str(run_dir), "--run.max_steps", "1"] + ["--resume"] * resume) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "RunDirectoryError" in err[0] and str(entry) in err[0]
    assert _entries(run_dir) == before


def test_a_resave_never_moves_a_users_file_at_its_name(tmp_path):
    """A stale .old- copy beside a user's file at checkpoint-N: recovery keeps both (it dropped the old copy)."""
    run_dir = tmp_path / "run"
    root = ckpt.checkpoint_root(run_dir)
    _complete_checkpoint(ckpt.stale_dir(run_dir, 3), 3)
    _file(root / "checkpoint-000003")
    ckpt.recover_interrupted_swaps(run_dir)
    assert (root / "checkpoint-000003").read_text() == "a user's notes\n"
    assert (ckpt.stale_dir(run_dir, 3) / ckpt.STATE_FILE).is_file()
