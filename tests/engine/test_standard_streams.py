"""The standard streams a command starts with. Closed ones (`>&-`, `2>&-`, `<&-`) are opened on /dev/null: before,
each note of a run printed logging's "--- Logging error ---" traceback (sys.stdout was None), and the next file the
command opened took the free descriptor, where a library or a reward function's child process would write. A stdout
that cannot be written (/dev/full, a full disk) drops what is written to it and is said in one line at the end,
exit 1: before, a run that had trained and saved ended with a logging traceback and "OSError: [Errno 28] No space left
on device", naming no file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from repo_paths import ROOT

CHILD = """
import json, logging, os, sys
from grpo_engine.cli import main
try:
    code = main(sys.argv[2:])
except SystemExit as exc:  # --help: argparse's exit
    code = exc.code
logging.getLogger("grpo_engine.probe").info("a note to stdout")
logging.getLogger("grpo_engine.probe").warning("warning: a note to stderr")
fd = os.open(os.devnull, os.O_RDONLY)  # what the next file the command opens gets
with open(sys.argv[1], "w") as report:
    json.dump({"code": code, "fd": fd, "streams": [s is not None for s in (sys.stdin, sys.stdout, sys.stderr)]}, report)
"""


def _metrics_dir(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "reward": 0.1 * s, "loss": 1.0 / s} for s in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="needs /dev/null")
@settings(max_examples=4, deadline=None)  # a Python start each (about 3 s on a loaded 2-core machine)
@given(closed=st.sets(st.sampled_from([0, 1, 2]), min_size=1), command=st.sampled_from(["plot", "help", "bad flag"]))
def test_closed_streams_are_opened_on_dev_null(closed, command, tmp_path_factory):
    pytest.importorskip("matplotlib")
    tmp = tmp_path_factory.mktemp("streams")
    argv = {"plot": ["plot", str(_metrics_dir(tmp))], "help": ["train", "--help"],
            "bad flag": ["train", "--run.max_step", "3"]}[command]
    report = tmp / "report.json"

    def close_them():
        for fd in closed:
            os.close(fd)

    done = subprocess.run([sys.executable, "-c", CHILD, str(report), *argv], preexec_fn=close_them, env=_env(),
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    result = json.loads(report.read_text())
    assert result["fd"] > 2 and all(result["streams"]), result  # no file of the command takes a standard descriptor
    assert result["code"] == {"plot": 0, "help": 0, "bad flag": 2}[command], (result, done.stderr)
    if 2 not in closed:
        assert "Logging error" not in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("command", ["plot", "train"])
def test_a_stdout_that_cannot_be_written_is_one_line_and_the_work_is_kept(command, tmp_path):
    pytest.importorskip("matplotlib")
    if command == "plot":
        run = _metrics_dir(tmp_path)
        argv = ["plot", str(run)]
    else:
        run = tmp_path / "train-run"
        argv = ["train", "--output-dir", str(run), "--run.max_steps", "1", "--run.warm_start_steps", "1",
                "--run.progress_bar", "false", "--data.builtin_max_operand", "2", "--data.builtin_eval_size", "0",
                "--rollout.num_generations", "4", "--rollout.max_new_tokens", "4",
                "--optim.per_device_train_batch_size", "4", "--run.loss_backend", "torch"]
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "grpo_engine", *argv], stdout=full, stderr=subprocess.PIPE,
                              env={**_env(), "OMP_NUM_THREADS": "1"}, cwd=ROOT, text=True, timeout=240)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith("grpo-engine: could not write to stdout (No space left on device)"), lines[0]
    assert (run / "curves.png").stat().st_size > 0  # the work is done and kept
    if command == "train":
        assert (run / "checkpoints" / "checkpoint-000001" / "checksums.json").is_file()
