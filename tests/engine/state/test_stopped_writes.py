"""A write stopped anywhere (a full disk, another OSError, Ctrl-C, at any byte, at the fsync or the rename) leaves
the file a user kept exactly as it was, and no partial file beside it; an OSError is one line naming the file.
Every writer of a file that outlives its command is tried: eval's --output, the plot, the run directory's
manifest and metrics.jsonl rebuilt on resume, the benchmark report's README block, the engine's atomic writer
itself. Before, each wrote in place: stopped at byte 0, the earlier file was left empty."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.state.atomic_file import FileWriteError, write_atomically
from tests.support.failing_writes import STAGES, stop_writes

ERRORS = {"full disk": lambda: OSError(errno.ENOSPC, "No space left on device"),
          "quota": lambda: OSError(errno.EDQUOT, "Disk quota exceeded"),
          "i/o error": lambda: OSError(errno.EIO, "Input/output error"),
          "Ctrl-C": lambda: KeyboardInterrupt()}


def _metrics_lines(steps: range) -> str:
    return "".join(json.dumps({"step": s, "reward": s / 10}) + "\n" for s in steps)


def _eval_output(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Callable[[], object]]:
    from grpo_engine.cli import main
    from grpo_engine.tools import evaluate

    (root / "model").mkdir()
    monkeypatch.setattr(evaluate, "run_eval", lambda *args, **kwargs: {"accuracy": 0.75, "pass@1": 0.75})
    target = root / "eval.json"
    target.write_text('{"accuracy": 0.5}\n')
    return target, lambda: main(["eval", "--model", str(root / "model"), "--output", str(target)])


def _plot(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Callable[[], object]]:
    pytest.importorskip("matplotlib")
    from grpo_engine.state.plot import plot_run

    (root / "metrics.jsonl").write_text(_metrics_lines(range(1, 4)))
    target = root / "curves.png"
    target.write_bytes(b"an earlier plot")
    return target, lambda: plot_run(root)


def _manifest(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Callable[[], object]]:
    from grpo_engine.state.run_files import MANIFEST, record_own

    (root / "config.yaml").write_text("run: {}\n")
    record_own(root, "config.yaml")
    (root / "samples.jsonl").write_text("")
    return root / MANIFEST, lambda: record_own(root, "samples.jsonl")


def _metrics_on_resume(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Callable[[], object]]:
    from grpo_engine.state.metrics import restore_history

    target = root / "metrics.jsonl"
    target.write_text(_metrics_lines(range(1, 7)) + '{"step": 7, "rew')  # a line cut off by a killed run
    return target, lambda: restore_history(target, 3, None)


def _readme_block(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Callable[[], object]]:
    from benchmarks.suite.report import update_readme

    target = root / "README.md"
    target.write_text("# Project\n<!-- benchmarks:begin -->\nold table\n<!-- benchmarks:end -->\nmore text\n")
    block = "<!-- benchmarks:begin -->\n| new | table |\n<!-- benchmarks:end -->\n"
    return target, lambda: update_readme(str(target), block)


def _atomic_writer(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Callable[[], object]]:
    target = root / "results.json"
    target.write_text('{"kept": true}\n')
    return target, lambda: write_atomically(target, json.dumps({"new": list(range(50))}))


WRITERS = {"eval --output": _eval_output, "plot": _plot, "run manifest": _manifest,
           "metrics.jsonl on resume": _metrics_on_resume, "README block": _readme_block,
           "write_atomically": _atomic_writer}


def _partial_files(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if ".partial-" in p.name)


@pytest.mark.parametrize("writer", WRITERS)
def test_each_writer_writes_when_nothing_stops_it(writer, tmp_path, monkeypatch):
    target, write = WRITERS[writer](tmp_path, monkeypatch)
    before = target.read_bytes()
    assert write() in (None, 0, target, str(target)) or writer == "plot"
    assert target.read_bytes() != before
    assert _partial_files(tmp_path) == []


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writer=st.sampled_from(sorted(WRITERS)), stage=st.sampled_from(STAGES),
       after_bytes=st.integers(0, 400) | st.integers(0, 4), error=st.sampled_from(sorted(ERRORS)))
def test_a_stopped_write_leaves_the_earlier_file_whole(writer, stage, after_bytes, error, tmp_path_factory, capsys):
    root = tmp_path_factory.mktemp("stopped")
    with pytest.MonkeyPatch.context() as monkeypatch:
        target, write = WRITERS[writer](root, monkeypatch)
        before = target.read_bytes()
        stop_writes(monkeypatch, stage, after_bytes, ERRORS[error]())
        try:
            outcome = write()
        except KeyboardInterrupt:
            assert error == "Ctrl-C"
            outcome = "stopped"
        except FileWriteError as exc:
            assert error != "Ctrl-C" and "\n" not in str(exc) and str(target) in str(exc), str(exc)
            assert exc.errno == ERRORS[error]().errno
            outcome = "stopped"
    if writer == "eval --output" and outcome in (1, 130):  # the command line: one line, status 1 (130: Ctrl-C)
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert outcome == (130 if error == "Ctrl-C" else 1), (outcome, last)
        assert error == "Ctrl-C" or (str(target) in last and "left as it was" in last), last
        outcome = "stopped"
    if outcome != "stopped":  # the stop point lay past the last byte written: the write completed
        assert stage == "write" and target.read_bytes() != before, (outcome, stage)
    else:
        assert target.read_bytes() == before
    assert _partial_files(root) == []
