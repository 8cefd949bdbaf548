"""The entries the engine writes in a run directory, each made of another kind (a directory where a log goes, a
FIFO, a link to a user's file, a file where checkpoints/ goes): one line naming it before any work, through the
CLI, where a directory metrics.jsonl failed at the first write after the model loaded and a linked metrics.jsonl
had the run append to the user's file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from grpo_engine.cli import main
from grpo_engine.state.run_lock import RUN_DIRECTORY_DIRS, RUN_DIRECTORY_FILES, RunDirectoryError, check_run_entries


def _directory(path: Path) -> None:
    path.mkdir()


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _link_to_user_file(path: Path) -> None:
    target = path.parent.parent / f"user-{path.name}"
    target.write_text("a user's notes\n")
    path.symlink_to(target)


def _file(path: Path) -> None:
    path.write_text("a user's notes\n")


WRONG_FOR_FILES = {"directory": (_directory, "is not a regular file"), "fifo": (_fifo, "is not a regular file"),
                   "link to a user's file": (_link_to_user_file, "is a link")}
WRONG_FOR_DIRS = {"file": (_file, "is not a directory"), "fifo": (_fifo, "is not a directory")}
CASES = [(name, kind) for name in RUN_DIRECTORY_FILES for kind in WRONG_FOR_FILES] + \
        [(name, kind) for name in RUN_DIRECTORY_DIRS for kind in WRONG_FOR_DIRS]


@pytest.mark.parametrize("name,kind", CASES)
def test_an_entry_of_the_engines_names_of_another_kind_is_named(tmp_path, name, kind):
    run = tmp_path / "run"
    run.mkdir()
    make, expected = (WRONG_FOR_FILES if name in RUN_DIRECTORY_FILES else WRONG_FOR_DIRS)[kind]
    make(run / name)
    with pytest.raises(RunDirectoryError, match=f"{name} {expected}"):
        check_run_entries(run)


def test_a_checkpoints_directory_linked_to_another_disk_is_accepted(tmp_path):
    elsewhere = tmp_path / "big-disk"
    elsewhere.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(elsewhere)
    check_run_entries(run)


@pytest.mark.parametrize("kind", sorted(WRONG_FOR_FILES))
def test_the_cli_refuses_before_any_work_and_the_users_file_is_untouched(tmp_path, kind, capsys):
    run = tmp_path / "run"
    run.mkdir()
    WRONG_FOR_FILES[kind][0](run / "metrics.jsonl")
    user_file = tmp_path / "user-metrics.jsonl"
    assert main(["train", "--output-dir", str(run), "--run.max_steps", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("grpo-engine train: RunDirectoryError: ") and "metrics.jsonl" in err[0]
    if user_file.exists():
        assert user_file.read_text() == "a user's notes\n"
