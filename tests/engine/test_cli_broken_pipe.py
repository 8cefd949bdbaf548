"""stdout's reader gone (`grpo-engine plot RUN | head -0`, a pager quit early): the command ends quietly with
status 141 (128 + SIGPIPE), as a Unix tool that SIGPIPE ends, and the engine's notes to such a stdout are dropped
while the run goes on. Before, `plot` printed "BrokenPipeError: [Errno 32] Broken pipe" and exited 1, and a
training run printed logging's "--- Logging error ---" traceback at its first note. A BrokenPipeError that is not
stdout's (a server's socket) is still one line naming it."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from grpo_engine import cli
from grpo_engine.messages import ENGINE_LOGGER, has_no_reader, show_messages

from repo_paths import ROOT


def _closed_pipe() -> tuple[int, int]:
    read_end, write_end = os.pipe()
    os.close(read_end)
    return read_end, write_end


def test_plot_into_a_closed_pipe_ends_quietly(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [{"step": s, "reward": 0.1 * s, "entropy": 1.0, "kl": None} for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    _, write_end = _closed_pipe()
    done = subprocess.run([sys.executable, "-m", "grpo_engine", "plot", str(tmp_path)], stdout=write_end,
                          stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    os.close(write_end)
    assert (done.returncode, done.stderr) == (141, "")
    assert (tmp_path / "curves.png").stat().st_size > 0


@settings(max_examples=25, deadline=None)
@given(levels=st.lists(st.sampled_from([logging.INFO, logging.WARNING]), min_size=1, max_size=6))
def test_notes_to_a_stdout_without_a_reader_are_dropped_and_the_run_goes_on(levels):
    show_messages()
    _, write_end = _closed_pipe()
    saved = os.dup(sys.__stdout__.fileno())
    stdout, sys.stdout = sys.stdout, sys.__stdout__
    try:
        os.dup2(write_end, sys.stdout.fileno())
        assert has_no_reader(sys.stdout)
        errors = []
        original, logging.Handler.handleError = logging.Handler.handleError, lambda self, record: errors.append(record)
        try:
            for level in levels:
                logging.getLogger(ENGINE_LOGGER + ".trainer").log(level, "a note")
        finally:
            logging.Handler.handleError = original
        assert errors == []
        if logging.INFO in levels:  # a note found the reader gone: what follows goes nowhere, raising nothing
            print("after", flush=True)
    finally:
        os.dup2(saved, sys.__stdout__.fileno())
        os.close(saved)
        os.close(write_end)
        sys.stdout = stdout


def test_a_broken_pipe_that_is_not_stdouts_is_one_line(monkeypatch, capsys):
    def broken(args):
        raise BrokenPipeError(32, "Broken pipe (the rollout server's socket)")

    monkeypatch.setattr(cli, "_plot", broken)
    assert cli.main(["plot", "somewhere"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "BrokenPipeError" in err[0] and "rollout server" in err[0]
