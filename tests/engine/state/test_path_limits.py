"""Paths near and over the filesystem's limits on a name (NAME_MAX, in bytes) and a whole path (PATH_MAX).

Before: a file whose name fit but came within some 20 bytes of the limit could not be written at all (its
temporary name was over it): `eval --output` evaluated, then failed. A name or path over the limit failed deep
inside with "[Errno 36] File name too long" and the whole path, thousands of characters on one line, some only
after the work; a run directory that fit, but left no room for its checkpoints' files, failed at its first save.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import main
from grpo_engine.state.atomic_file import write_atomically
from grpo_engine.state.path_limits import PathTooLong, limits_at
from grpo_engine.state.run_lock import check_output_dir

ROOT = Path(tempfile.gettempdir())
NAME_MAX, PATH_MAX = limits_at(ROOT)

# Letters of 1 to 4 bytes in UTF-8: a name's limit is in bytes, not characters.
LETTERS = st.sampled_from(["a", "Z", "7", "-", "_", " ", "é", "ß", "€", "中", "😀"])


def _fit(text: str, limit: int) -> str:
    while text and len(os.fsencode(text)) > limit:
        text = text[:-1]
    return text


@st.composite
def names_that_fit(draw) -> str:
    """A file name of up to NAME_MAX bytes, most of them near it, with or without a suffix."""
    suffix = draw(st.sampled_from(["", ".json", ".png", ".jsonl", ".tar.gz"]))
    size = draw(st.one_of(st.integers(1, NAME_MAX), st.integers(NAME_MAX - 40, NAME_MAX)))
    stem = draw(st.text(LETTERS, min_size=size, max_size=size))
    name = _fit(stem, size - len(suffix.encode())) + suffix
    return name if name.strip(". ") else "x" + suffix


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=names_that_fit(), content=st.binary(max_size=64))
def test_any_name_the_filesystem_takes_can_be_written_whole(name, content, tmp_path):
    directory = Path(tempfile.mkdtemp(dir=tmp_path))
    target = directory / name
    write_atomically(target, content)
    assert target.read_bytes() == content
    assert os.listdir(directory) == [name]  # no temporary left beside it
    write_atomically(target, content + b"!")  # replacing it too
    assert target.read_bytes() == content + b"!" and os.listdir(directory) == [name]


@st.composite
def over_long_paths(draw) -> str:
    """A path under ROOT with one name over NAME_MAX, or with a whole over PATH_MAX."""
    if draw(st.booleans()):
        size = draw(st.integers(NAME_MAX + 1, NAME_MAX * 3))
        name = draw(st.text(LETTERS, min_size=size, max_size=size))
        while len(os.fsencode(name)) <= NAME_MAX:
            name += "x"
        return str(ROOT / "grpo-limits" / name / "leaf")
    name = "d" * draw(st.integers(100, NAME_MAX))
    depth = PATH_MAX // (len(name) + 1) + draw(st.integers(1, 3))
    return str(ROOT.joinpath(*[name] * depth))


COMMANDS = {
    "train --output-dir": lambda p: ["train", "--output-dir", p],
    "train --data": lambda p: ["train", "--data", p + ".jsonl", "--output-dir", str(ROOT / "grpo-limits-unused")],
    "train --config": lambda p: ["train", "--config", p + ".yaml"],
    "eval --model": lambda p: ["eval", "--model", p],
    "eval --output": lambda p: ["eval", "--model", str(ROOT), "--output", p + ".json"],
    "plot RUN_DIR": lambda p: ["plot", p],
    "plot --output": lambda p: ["plot", str(ROOT), "--output", p],
}
# the flag, or the config key it sets (the schema's path check names the key)
OPTION_NAMED = {"train --output-dir": ("--output-dir", "run.output_dir"), "train --data": "data.path", "train --config": "--config",
                "eval --model": "model.name_or_path", "eval --output": "--output", "plot RUN_DIR": "run_dir",
                "plot --output": "--output"}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(sorted(COMMANDS)), path=over_long_paths())
def test_a_path_over_the_limits_is_one_short_line_naming_its_option_before_any_work(command, path, capsys,
                                                                                    monkeypatch):
    from grpo_engine.tools import evaluate

    monkeypatch.setattr(evaluate, "run_eval", lambda *a, **k: pytest.fail("evaluated before the path was checked"))
    code = main(COMMANDS[command](path))
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1 and "Traceback" not in captured.err, captured.err[-1000:]
    named = OPTION_NAMED[command]
    assert any(name in lines[0] for name in ((named,) if isinstance(named, str) else named)), lines[0][:600]
    assert "bytes" in lines[0], lines[0][:600]
    assert len(lines[0]) < 600, lines[0][:600]  # the path is shown elided, not whole
    assert not (ROOT / "grpo-limits-unused").exists()


@settings(max_examples=40, deadline=None)
@given(spare=st.integers(0, 140), name_size=st.integers(60, NAME_MAX))
def test_a_run_directory_without_room_for_its_checkpoints_is_refused_before_it_starts(spare, name_size):
    """A run directory whose path fits, but within 140 bytes of PATH_MAX: its checkpoint files would not."""
    name = "r" * name_size
    parts, size = [], len(os.fsencode(str(ROOT)))
    target = PATH_MAX - 1 - spare
    while size + 1 + name_size <= target:
        parts.append(name)
        size += 1 + name_size
    if size < target - 1:
        parts.append("s" * (target - size - 1))
    run_dir = ROOT.joinpath(*parts)
    assert len(os.fsencode(str(run_dir))) < PATH_MAX
    with pytest.raises(PathTooLong, match="checkpoint files"):
        check_output_dir(run_dir)
