"""Files the engine writes whole (state/atomic_file: temporary file, rename) whose target is not a regular file: a
FIFO, a character device (/dev/null, /dev/stdout's pipe), a link. Before, the rename replaced the FIFO or, as root,
/dev/null itself with a regular file (`eval --output /dev/null` left the machine without its /dev/null), and a
link to a user's file was replaced by a file, the user's file left stale. Now a FIFO or device is one line naming
it, before any work from the CLI and untouched by any writer, and a link's target is written, the link kept."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import main
from grpo_engine.state.atomic_file import FileWriteError, write_atomically
from grpo_engine.state.run_lock import RunDirectoryError, check_output_file


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _null_device(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers, at a path of the test's own


SPECIAL = {"fifo": (_fifo, stat.S_ISFIFO, "a FIFO"), "null device": (_null_device, stat.S_ISCHR, "a character device")}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(sorted(SPECIAL)), through_link=st.booleans(), content=st.binary(max_size=64),
       name=st.sampled_from(["out.json", "curves.png", "metrics.jsonl", "x"]))
def test_a_fifo_or_device_is_never_replaced(kind, through_link, content, name, tmp_path_factory):
    directory = tmp_path_factory.mktemp("out")
    make, is_kind, said = SPECIAL[kind]
    target = directory / name
    make(target)
    given_path = target
    if through_link:
        given_path = directory / f"link-{name}"
        given_path.symlink_to(target)
    with pytest.raises(FileWriteError) as raised:
        write_atomically(given_path, content)
    assert said in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises(RunDirectoryError, match=said):
        check_output_file(given_path)
    assert is_kind(os.stat(target).st_mode)
    assert sorted(p.name for p in directory.iterdir()) == sorted({target.name, given_path.name})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=64), depth=st.integers(1, 3))
def test_a_link_to_a_users_file_writes_that_file_and_stays_a_link(content, depth, tmp_path_factory):
    directory = tmp_path_factory.mktemp("out")
    target = directory / "users-file.json"
    target.write_text("old")
    link = target
    for i in range(depth):
        link_i = directory / f"link{i}"
        link_i.symlink_to(link.name)
        link = link_i
    write_atomically(link, content)
    assert link.is_symlink() and target.read_bytes() == content and not target.is_symlink()
    assert sorted(p.name for p in directory.iterdir()) == sorted([target.name] + [f"link{i}" for i in range(depth)])


def test_eval_output_dev_null_is_refused_before_any_work(capsys):
    assert main(["eval", "--model", "org/model", "--output", os.devnull]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and os.devnull in err[0] and "character device" in err[0]
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
