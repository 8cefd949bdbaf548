"""A process of a launched run lost mid-run (killed, out of memory, stopped on its own error, frozen): the others
stop with one line naming it (its rank and pid when it ran on their machine), the setting for a wait that timed
out, the last checkpoint and --resume. Before, the survivors printed gloo's own text ("[.../gloo/transport/tcp/
pair.cc:537] Read error [127.0.0.1]:37801: Connection reset by peer. ... GLHF!" or "Timed out waiting 10000ms for
recv operation to complete"), naming no process, setting or way on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings, strategies as st

from grpo_engine import lost_process
from grpo_engine.lost_process import lost_process_error

from processes import free_port, subprocess_env
from repo_paths import ROOT

GLOO_FILES = st.sampled_from(["transport/tcp/pair.cc:537", "transport/tcp/pair.cc:553",
                              "transport/tcp/unbound_buffer.cc:78", "transport/tcp/unbound_buffer.cc:136"])
CAUSES = st.sampled_from(["Read error [127.0.0.1]:{port}: Connection reset by peer",
                          "Connection closed by peer [127.0.0.1]:{port}",
                          "Write error [10.0.0.7]:{port}: Broken pipe",
                          "Timed out waiting {ms}ms for recv operation to complete",
                          "Timed out waiting {ms}ms for send operation to complete"])
STATES = ["running", "ended", "zombie", "stopped"]


def _gloo_error(file: str, cause: str, port: int, ms: int) -> RuntimeError:
    text = cause.format(port=port, ms=ms)
    return RuntimeError(f"[/__w/pytorch/pytorch/third_party/gloo/gloo/{file}] {text}. This is typically caused by "
                        f"a remote worker crashing. Check the logs of the remote worker before reporting an error. "
                        f"GLHF! \N{UMBRELLA ON GROUND}")


def _process_in(state: str) -> tuple[int, subprocess.Popen]:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    if state in ("ended", "zombie"):
        child.kill()
        if state == "ended":
            child.wait()
        else:  # killed, not yet reaped by its parent: as a launcher's worker is for a moment
            while open(f"/proc/{child.pid}/stat").read().rpartition(")")[2].split()[0] != "Z":
                time.sleep(0.01)
    elif state == "stopped":
        child.send_signal(signal.SIGSTOP)
        while open(f"/proc/{child.pid}/stat").read().rpartition(")")[2].split()[0] != "T":
            time.sleep(0.01)
    return child.pid, child


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads process states from /proc")
@settings(max_examples=12, deadline=None)
@given(file=GLOO_FILES, cause=CAUSES, port=st.integers(1024, 65535), ms=st.integers(1000, 10**7),
       states=st.lists(st.sampled_from(STATES), min_size=1, max_size=3), me=st.integers(0, 3),
       saved=st.lists(st.integers(1, 999), max_size=3, unique=True), timeout_s=st.floats(1.0, 7200.0))
def test_a_lost_process_is_named_in_one_line(file, cause, port, ms, states, me, saved, timeout_s, tmp_path_factory):
    import socket

    run_dir = tmp_path_factory.mktemp("run")
    for step in saved:
        (run_dir / "checkpoints" / f"checkpoint-{step:06d}").mkdir(parents=True)
        (run_dir / "checkpoints" / f"checkpoint-{step:06d}" / "trainer_state.json").write_text("{}")
    children = [_process_in(state) for state in states]
    table = [(socket.gethostname(), pid) for pid, _ in children]
    table.insert(min(me, len(table)), (socket.gethostname(), os.getpid()))
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(lost_process, "_processes", table)
            error = lost_process_error(_gloo_error(file, cause, port, ms), timeout_s, str(run_dir), settle_s=0.0)
    finally:
        for pid, child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGCONT)
                child.kill()
            child.wait()
    message = str(error)
    assert "\n" not in message and "GLHF" not in message and ".cc:" not in message, message
    ranks = {pid: rank for rank, (_, pid) in enumerate(table)}
    for (pid, _), state in zip(children, states):
        named = f"process {ranks[pid]} (pid {pid} on this machine"
        assert (named in message) == (state != "running"), (state, message)
    if all(state == "running" for state in states):
        assert "lost another process of the run" in message, message
    assert ("run.distributed_timeout_s" in message) == cause.startswith("Timed out"), message
    last = f"checkpoint-{max(saved):06d}" if saved else "no checkpoint was saved yet"
    assert last in message and "--resume" in message, message


@pytest.mark.parametrize("error", [RuntimeError("CUDA out of memory"), ValueError("/gloo/ in a value error"),
                                   KeyError("x")])
def test_other_errors_are_left_as_they_are(error, monkeypatch, tmp_path):
    monkeypatch.setattr(lost_process, "_processes", [("host", 1), ("host", 2)])
    assert lost_process_error(error, 60.0, str(tmp_path)) is None


@pytest.mark.slow
@pytest.mark.parametrize("victim", [0, 1])
def test_a_rank_killed_mid_run_is_named_by_the_other_at_once(victim, tmp_path):
    """2 CPU processes started as torchrun starts them (its variables; each process's stderr on its own, and no
    launcher to end the survivor first); one is SIGKILLed after the first checkpoint: the other stops within
    seconds (not gloo's 30-minute default) with one line naming the killed rank and pid."""
    run_dir = tmp_path / "run"
    flags = ["--run.output_dir", str(run_dir), "--run.max_steps", "100000", "--run.save_steps", "1",
             "--run.progress_bar", "false", "--run.plot", "false", "--run.warm_start_steps", "0",
             "--data.builtin_max_operand", "2", "--data.builtin_eval_size", "0", "--rollout.num_generations", "4",
             "--rollout.max_new_tokens", "4", "--optim.per_device_train_batch_size", "2",
             "--run.log_completions_steps", "0", "--run.loss_backend", "torch"]
    launch = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    ranks = [subprocess.Popen([sys.executable, "-m", "grpo_engine", "train", *flags], cwd=ROOT,
                              env={**subprocess_env(), **launch, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    survivor = ranks[1 - victim]
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "checkpoints" / "checkpoint-000001").is_dir():
            assert all(rank.poll() is None for rank in ranks) and time.monotonic() < deadline
            time.sleep(0.1)
        ranks[victim].kill()
        killed = time.monotonic()
        _, err = survivor.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
            rank.communicate()
    lines = [line for line in err.splitlines() if line.strip()]
    assert survivor.returncode == 1 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith("grpo-engine train: ProcessGroupError: process ")
    assert f"lost process {victim} (pid {ranks[victim].pid} on this machine, which has ended)" in lines[0], lines[0]
    assert "checkpoint-0000" in lines[0] and took < 30, (took, lines[0])



@pytest.mark.parametrize("under_torchrun", [True, False])
def test_under_torchrun_the_launchers_stop_does_not_cut_the_line_short(under_torchrun, monkeypatch, tmp_path):
    """torchrun sends the survivors SIGTERM about 0.1 s after the loss: a survivor converting gloo's error ignores it
    from then on (its line comes out, it exits 1); without torchrun SIGTERM keeps its handler."""
    from grpo_engine.lost_process import lost_processes_named
    from grpo_engine.process_group import ProcessGroupError

    monkeypatch.setenv("WORLD_SIZE", "2")
    if under_torchrun:
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    else:
        monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setattr(lost_process, "_processes", [("elsewhere", 1), ("elsewhere", 2)])
    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(ProcessGroupError, match="lost another process of the run"):
            with lost_processes_named(60.0, str(tmp_path)):
                raise _gloo_error("transport/tcp/pair.cc:537", "Read error [127.0.0.1]:{port}: Connection reset by "
                                  "peer", 4242, 0)
        assert (signal.getsignal(signal.SIGTERM) is signal.SIG_IGN) == under_torchrun
    finally:
        signal.signal(signal.SIGTERM, before)


@settings(max_examples=25, deadline=None)
@given(file=GLOO_FILES, cause=CAUSES, port=st.integers(1024, 65535), ms=st.integers(1000, 10**7),
       rank=st.integers(0, 7), world=st.integers(2, 9))
def test_a_process_lost_before_the_processes_were_recorded_is_one_line(file, cause, port, ms, rank, world,
                                                                         tmp_path_factory):
    """The first collective (where the processes record each other) failed with gloo's raw text: a process started by
    hand with another WORLD_SIZE, or a second process given the same RANK, joined and then never answered or left."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lost_process, "_processes", [])
        patch.setenv("WORLD_SIZE", str(world))
        patch.setenv("RANK", str(rank))
        error = lost_process_error(_gloo_error(file, cause, port, ms), 60.0, str(tmp_path_factory.mktemp("run")))
    message = str(error)
    assert error is not None and "\n" not in message and "GLHF" not in message and ".cc:" not in message, message
    assert message.startswith(f"process {rank} of WORLD_SIZE={world} lost another process while the processes met")
    assert "the same WORLD_SIZE" in message and "a RANK of its own" in message, message
