"""Circumstances of the process itself: a CUDA_VISIBLE_DEVICES that CUDA stops reading partway (a typo left no GPU
and run.device auto trained on the CPU), and a current directory deleted under the shell (relative paths mean
nothing; torch's MKL failed to load with a fatal error, plot printed a traceback). One line each, before any work."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from grpo_engine.config import ConfigError
from grpo_engine.launch_env import check_environment

from repo_paths import ROOT

ENTRY = st.one_of(st.integers(0, 15).map(str), st.just("-1"),
                  st.uuids().map(lambda u: f"GPU-{u}"), st.uuids().map(lambda u: f"MIG-GPU-{u}/1/0"))
GARBAGE = st.text(min_size=1, max_size=8).filter(
    lambda t: t.strip() != "NoDevFiles" and not re.fullmatch(r"-?[0-9]+|(GPU|MIG)-[0-9A-Za-z/_-]+", t.strip()))


@settings(max_examples=200, deadline=None)
@given(entries=st.lists(ENTRY, max_size=4), bad=st.one_of(st.none(), GARBAGE), at=st.integers(0, 4))
def test_visible_devices_are_a_list_cuda_reads_whole(entries, bad, at):
    items = list(entries)
    if bad is not None and "," not in bad:
        items.insert(min(at, len(items)), bad)
    text = ",".join(items)
    try:
        check_environment({"CUDA_VISIBLE_DEVICES": text})
    except ConfigError as exc:
        assert bad is not None and "," not in bad, text
        assert "environment variable CUDA_VISIBLE_DEVICES=" in str(exc) and "\n" not in str(exc)
    else:
        assert bad is None or "," in bad, text


@pytest.mark.parametrize("text", ["", "NoDevFiles", "-1", "0", "0,1", " 0, 1"])
def test_what_schedulers_set_is_accepted(text):
    check_environment({"CUDA_VISIBLE_DEVICES": text})


@pytest.mark.parametrize("argv", [["plot", "run"], ["plot", "/abs/run"], ["train", "--output-dir", "out"],
                                  ["eval", "--model", "org/model"]])
def test_a_deleted_working_directory_is_one_line(argv, tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    code = (f"import os, sys; os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); "
            f"from grpo_engine.cli import main; sys.exit(main({argv!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "current directory is gone" in lines[0], done.stderr
