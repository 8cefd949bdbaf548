"""Where a command writes, set against what it reads, as a user can lay them out: the run directory (or eval's
--output) the dataset itself, inside a dataset directory, reached through a link, holding the dataset (or the model)
where the run writes its own files or rotation deletes checkpoints, a model's own file, behind a loop of links; or
apart (a sibling, a parent, the data elsewhere in the run directory, a run inside the model directory). `grpo-engine train` / `eval` starts its work only when they are apart; otherwise it stops in one line
naming the option, and nothing on disk changes (hypothesis). Before, `--data shards --output-dir shards` trained
and left the run's checkpoints and logs among the data files."""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import main

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Where the output goes, relative to what the command reads, and whether that overlaps it, per command: "shards"
# where it does when the data is the directory of files, not one file in it (which a run may sit beside); None where
# the layout is not one of that command (eval's --output is a file: a directory there is check_output_file's).
LAYOUTS = {
    "the data directory": {"train": "shards", "eval": None},
    "inside the data directory": {"train": "shards", "eval": "shards"},
    "deep inside the data directory": {"train": "shards", "eval": "shards"},
    "a link to the data directory": {"train": "shards", "eval": None},
    "inside a link to the data directory": {"train": "shards", "eval": "shards"},
    "the data file": {"train": True, "eval": True},
    "a loop of links": {"train": True, "eval": True},
    "data at the run's samples.jsonl": {"train": True, "eval": None},
    "data inside the run's checkpoints/": {"train": True, "eval": None},
    "a model inside the run's checkpoints/": {"train": True, "eval": None},
    "inside the model directory": {"train": False, "eval": True},
    "the model's config.json": {"train": True, "eval": True},
    "a sibling": {"train": False, "eval": False},
    "the data's parent": {"train": False, "eval": None},
    "data elsewhere in the run directory": {"train": False, "eval": None},
}


class WorkStarted(Exception):
    pass


def _layout(root: Path, layout: str, shards: bool) -> tuple[str, str, str]:
    """(data path, output path, model directory) laid out under `root`."""
    row = '{"prompt": "1+1=", "answer": "2"}\n'
    data_dir, model = root / "data", root / "model"
    data_dir.mkdir()
    (data_dir / "part-0.jsonl").write_text(row)
    model.mkdir()
    (model / "config.json").write_text("{}")
    data = data_dir if shards else data_dir / "part-0.jsonl"
    output = {
        "the data directory": data_dir, "inside the data directory": data_dir / "run",
        "deep inside the data directory": data_dir / "a" / "b", "a link to the data directory": root / "link",
        "inside a link to the data directory": root / "link" / "run", "the data file": data_dir / "part-0.jsonl",
        "a loop of links": root / "loop1" / "run", "a sibling": root / "run", "the data's parent": root,
        "inside the model directory": model / "out", "the model's config.json": model / "config.json",
    }.get(layout)
    os.symlink(data_dir, root / "link")
    os.symlink(root / "loop2", root / "loop1")
    os.symlink(root / "loop1", root / "loop2")
    if layout == "data at the run's samples.jsonl":
        output = root / "run"
        output.mkdir()
        (output / "samples.jsonl").write_text(row)
        data = output / "samples.jsonl"
    elif layout == "data inside the run's checkpoints/":
        output = root / "run"
        (output / "checkpoints").mkdir(parents=True)
        (output / "checkpoints" / "d.jsonl").write_text(row)
        data = output / "checkpoints" / "d.jsonl"
    elif layout == "a model inside the run's checkpoints/":
        output = root / "run"
        model = output / "checkpoints" / "checkpoint-000001" / "model"
        shutil.copytree(root / "model", model)
    elif layout == "data elsewhere in the run directory":
        output = root / "run"
        (output / "inputs").mkdir(parents=True)
        (output / "inputs" / "d.jsonl").write_text(row)
        data = output / "inputs" / "d.jsonl"
    return str(data), str(output), str(model)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
            for p in root.rglob("*") if not p.name.startswith("loop")}


def _no_work(monkeypatch, command: str) -> None:
    module, name = {"train": ("grpo_engine.trainer", "train"), "eval": ("grpo_engine.tools.evaluate", "run_eval")}[
        command]

    def started(*args, **kwargs):
        raise WorkStarted

    monkeypatch.setattr(importlib.import_module(module), name, started)


@SETTINGS
@given(layout=st.sampled_from(sorted(LAYOUTS)), shards=st.booleans(), command=st.sampled_from(["train", "eval"]))
def test_a_command_writes_apart_from_what_it_reads_or_stops_in_one_line_with_nothing_changed(
        layout, shards, command, tmp_path_factory, monkeypatch, capsys):
    expected = LAYOUTS[layout][command]
    if expected is None:
        return
    root = tmp_path_factory.mktemp("layout")
    data, output, model = _layout(root, layout, shards)
    monkeypatch.chdir(root)
    _no_work(monkeypatch, command)
    before = _tree(root)
    option = "--output-dir" if command == "train" else "--output"
    try:
        outcome = main([command, "--data", data, option, output, "--model", model])
    except WorkStarted:
        outcome = "started"
    lines = capsys.readouterr().err.splitlines()
    if not (shards if expected == "shards" else expected):
        assert outcome == "started", (layout, lines)
        return
    assert outcome != "started", (layout, shards, command)
    assert len(lines) == 1 and option in lines[0] and "Traceback" not in lines[0], lines
    assert _tree(root) == before, layout
