"""Run directories in circumstances a user makes by accident, each one line before any work: a path whose name starts
or ends with white space (a directory with the space in its name was made silently), a umask that takes a permission
from the owner (a raw PermissionError after the imports), a lock file this user cannot open (another user's, or made
immutable: a raw PermissionError), and `plot RUN/metrics.jsonl` (".../metrics.jsonl/metrics.jsonl does not
exist")."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.config.path_form import path_form_problem
from grpo_engine.state import run_lock
from grpo_engine.state.plot import plot_run_dir
from grpo_engine.state.run_lock import LOCK_FILE, RunDirectoryError, check_output_dir

SPACES = st.sampled_from([" ", "\t", "\u00a0", "\u3000", "  "])
NAMES = st.text(st.characters(whitelist_categories=("Ll", "Nd")), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(parts=st.lists(NAMES, min_size=1, max_size=4), at=st.integers(0, 3), space=SPACES,
       end=st.sampled_from(["start", "end"]))
def test_a_name_starting_or_ending_with_white_space_is_refused(parts, at, space, end, tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    at %= len(parts)
    parts[at] = space + parts[at] if end == "start" else parts[at] + space
    problem = path_form_problem(str(base / "/".join(parts)))
    if space == "\t":  # a control character: named as one first
        assert problem is not None and "control character" in problem
        return
    assert problem is not None and "white space" in problem and "\n" not in problem, problem
    assert path_form_problem(str(base / "/".join(part.strip() for part in parts))) is None


def test_a_padded_name_that_exists_as_written_is_taken(tmp_path):
    (tmp_path / "kept ").mkdir()
    assert path_form_problem(str(tmp_path / "kept " / "run")) is None
    assert path_form_problem(str(tmp_path / "inner space" / "run")) is None


@settings(max_examples=30, deadline=None)
@given(mask=st.integers(0, 0o777))
def test_a_umask_taking_an_owner_permission_is_refused_before_the_run(mask, tmp_path_factory):
    directory = tmp_path_factory.getbasetemp() / "umask-run"
    old = os.umask(mask)
    try:
        if mask & 0o700:
            with pytest.raises(RunDirectoryError) as refused:
                check_output_dir(directory)
            assert f"umask {mask:04o}" in str(refused.value) and "run.output_dir" in str(refused.value)
        else:
            check_output_dir(directory)
    finally:
        os.umask(old)
    assert not directory.exists()


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM])
def test_a_lock_file_that_cannot_be_opened_is_one_line_naming_the_directory(code, tmp_path, monkeypatch):
    (tmp_path / LOCK_FILE).write_text("")
    real_open = os.open

    def refusing(path, flags, *args):
        if str(path).endswith(LOCK_FILE):
            raise PermissionError(code, os.strerror(code), str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(run_lock.os, "open", refusing)
    with pytest.raises(RunDirectoryError) as refused:
        check_output_dir(tmp_path)
    message = str(refused.value)
    assert str(tmp_path) in message and "--output-dir" in message and "\n" not in message, message
    assert ("chattr -i" in message) == (code == errno.EPERM), message


def test_an_immutable_lock_file_is_refused_naming_it(tmp_path):
    lock = tmp_path / LOCK_FILE
    lock.write_text("")
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(lock)], capture_output=True).returncode:
        pytest.skip("chattr +i is not allowed here (needs root on a filesystem with the attribute)")
    try:
        with pytest.raises(RunDirectoryError, match="immutable"):
            check_output_dir(tmp_path)
    finally:
        subprocess.run(["chattr", "-i", str(lock)], check=True)


def test_plot_takes_a_runs_metrics_file_and_names_the_directory_for_another_file(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    (tmp_path / "config.yaml").write_text("")
    assert plot_run_dir(str(tmp_path / "metrics.jsonl")) == str(tmp_path)
    assert plot_run_dir(str(tmp_path)) == str(tmp_path)
    with pytest.raises(ValueError, match="name the directory that holds metrics.jsonl") as refused:
        plot_run_dir(str(tmp_path / "config.yaml"))
    assert str(tmp_path) in str(refused.value)



@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text("abcdefghijklmnopqrstuvwxyz-_.0123456789", min_size=1, max_size=12).filter(
    lambda name: name not in (".", "..", "metrics.jsonl")))
def test_plot_follows_a_link_to_a_runs_metrics_file_whatever_its_name(name, tmp_path_factory):
    """A link to a run's metrics.jsonl named otherwise (latest.jsonl) plots that run; the folder of a file that
    holds no metrics.jsonl is not offered (it was: "name the directory that holds metrics.jsonl ('/elsewhere'?)")."""
    run, elsewhere = tmp_path_factory.mktemp("run"), tmp_path_factory.mktemp("elsewhere")
    (run / "metrics.jsonl").write_text("")
    (elsewhere / name).symlink_to(run / "metrics.jsonl")
    assert plot_run_dir(str(elsewhere / name)) == str(run)
    (elsewhere / f"{name}.txt").write_text("")
    with pytest.raises(ValueError, match="name the directory that holds metrics.jsonl$"):
        plot_run_dir(str(elsewhere / f"{name}.txt"))
