"""Circumstances of the process itself: a CUDA_VISIBLE_DEVICES that CUDA stops reading partway (a typo left no GPU
and run.device auto trained on the CPU), a GLOO_SOCKET_IFNAME naming no interface of the machine (the join failed
blaming MASTER_ADDR and MASTER_PORT), a TORCH_DISTRIBUTED_DEBUG torch does not take (torch's ValueError after the
imports, or torchrun's traceback), and a current directory deleted under the shell (relative paths mean nothing;
torch's MKL failed to load with a fatal error, plot printed a traceback). One line each, before any work."""

from __future__ import annotations

import os
import re
import socket
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
    lambda t: t.strip() not in ("", "NoDevFiles")  # blank is empty: every GPU hidden on purpose
    and not re.fullmatch(r"-?[0-9]+|(GPU|MIG)-[0-9A-Za-z/_-]+", t.strip()))


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


INTERFACES = [name for _, name in socket.if_nameindex()] if hasattr(socket, "if_nameindex") else []


@pytest.mark.skipif(not INTERFACES, reason="no interface list on this platform")
@settings(max_examples=100, deadline=None)
@given(names=st.lists(st.one_of(st.sampled_from(INTERFACES or ["lo"]),
                                st.text(st.characters(codec="ascii", exclude_characters=","), min_size=1, max_size=12)),
                      min_size=1, max_size=3))
def test_gloo_interfaces_are_this_machines(names):
    text = ",".join(names)
    expected_fine = len(text) <= 1 or all(name in INTERFACES for name in names)  # gloo reads it from 2 characters
    try:
        check_environment({"GLOO_SOCKET_IFNAME": text})
    except ConfigError as exc:
        assert not expected_fine, text
        assert "environment variable GLOO_SOCKET_IFNAME=" in str(exc) and "\n" not in str(exc)
        assert all(name in str(exc) for name in INTERFACES)  # the ones to choose from
    else:
        assert expected_fine, text


@settings(max_examples=100, deadline=None)
@given(text=st.one_of(st.sampled_from(["OFF", "INFO", "DETAIL"]).flatmap(
    lambda level: st.sampled_from([level, level.lower(), level.capitalize(), level.lower().replace("i", "\u0131")])),
    st.text(max_size=8)))
def test_the_distributed_debug_level_is_one_torch_takes(text):
    try:
        check_environment({"TORCH_DISTRIBUTED_DEBUG": text})
    except ConfigError as exc:
        assert not (text.isascii() and text.upper() in ("OFF", "INFO", "DETAIL"))
        assert "environment variable TORCH_DISTRIBUTED_DEBUG=" in str(exc) and "OFF, INFO or DETAIL" in str(exc)
    else:
        assert text.isascii() and text.upper() in ("OFF", "INFO", "DETAIL")


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


def accepted_only_if(readable: bool, name: str, text: str) -> None:
    """`name`=`text` passes the start's check when its reader takes it, and is one line naming it otherwise."""
    try:
        check_environment({name: text})
    except ConfigError as exc:
        assert not readable, text
        assert str(exc).startswith(f"environment variable {name}=") and "\n" not in str(exc)
    else:
        assert readable, text


@settings(max_examples=150, deadline=None)
@given(text=st.one_of(st.integers(-5, 10_000).map(str), st.text(max_size=6)),
       name=st.sampled_from(["MKL_NUM_THREADS", "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT"]))
def test_whole_numbers_the_libraries_read_are_whole_numbers(text, name):
    """torch took MKL_NUM_THREADS=abc (or -1) for one thread, silently; huggingface_hub's import stopped on
    HF_HUB_ETAG_TIMEOUT=abc with "invalid literal for int()" naming nothing. A count each reads is accepted."""
    readable = text.strip().isascii() and text.strip().isdigit() and int(text) >= 1
    accepted_only_if(readable, name, text)


HUB_SWITCHES = ["HF_HUB_OFFLINE", "HF_HUB_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_TELEMETRY",
                "HF_HUB_DISABLE_IMPLICIT_TOKEN", "HF_HUB_DISABLE_SYMLINKS", "HF_HUB_DISABLE_XET"]


@settings(max_examples=150, deadline=None)
@given(text=st.one_of(st.sampled_from(["1", "true", "Yes", " on", "0", "off", "No", "", "ture", "enabled", "2"]),
                      st.text(max_size=6)),
       name=st.sampled_from(HUB_SWITCHES))
def test_the_hub_switches_take_the_words_huggingface_hub_reads(text, name):
    """huggingface_hub reads each of its switches as true for 1 / on / yes / true and false for any other word: a
    typo (`ture`) turned the switch off, silently. The words it means either way are accepted, any other refused."""
    accepted_only_if(text.strip().upper() in ("1", "ON", "YES", "TRUE", "", "0", "OFF", "NO", "FALSE"), name, text)


@settings(max_examples=150, deadline=None)
@given(text=st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(str), st.integers(-5, 10**12).map(str),
                      st.sampled_from(["2GB", "1e9 ", "1_000", "", "\uff11"]), st.text(max_size=6)))
def test_the_datasets_memory_size_is_a_number_datasets_reads(text):
    """datasets reads HF_DATASETS_IN_MEMORY_MAX_SIZE with float() as it is imported: `2GB` stopped the command with
    "could not convert string to float" naming no variable. What float() reads as a finite size >= 0 is accepted."""
    try:
        readable = 0 <= float(text) < float("inf")
    except ValueError:
        readable = False
    accepted_only_if(readable, "HF_DATASETS_IN_MEMORY_MAX_SIZE", text)


def test_a_datasets_size_it_cannot_read_stops_the_command_in_one_line(tmp_path):
    """End to end: the command's one line names the variable, before datasets' import could stop it."""
    done = subprocess.run([sys.executable, "-m", "grpo_engine", "train", "--run.max_steps", "1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "HF_DATASETS_IN_MEMORY_MAX_SIZE": "2GB"})
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("grpo-engine: ") and "HF_DATASETS_IN_MEMORY_MAX_SIZE='2GB'" in lines[0], lines
