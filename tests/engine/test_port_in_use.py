"""A port the engine listens on already held by another program: the rendezvous port rank 0 hosts (MASTER_PORT),
`serve --port`, and rollout.server.nccl_port of an NCCL weight push. One line naming the port, before any work.
Before, a held MASTER_PORT waited for run.distributed_timeout_s and then said the processes "could not join the
others"; `serve` left it to vLLM after the model loaded."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings, strategies as st

from grpo_engine.cli import main
from grpo_engine.config import ConfigError, load_config
from grpo_engine.launch_env import check_environment, listen_problem


@pytest.fixture
def held_port():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        yield holder.getsockname()[1]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


@settings(max_examples=30, deadline=None)
@given(world=st.integers(2, 8), agent_store=st.sampled_from([None, "True", "False"]), rank=st.integers(0, 1),
       addr=st.sampled_from(["127.0.0.1", "localhost"]))
def test_a_held_rendezvous_port_is_named_on_rank_0(world, agent_store, rank, addr):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        env = {"WORLD_SIZE": str(world), "RANK": str(rank), "MASTER_ADDR": addr, "MASTER_PORT": str(port)}
        if agent_store is not None:
            env["TORCHELASTIC_USE_AGENT_STORE"] = agent_store
        if rank == 0 and agent_store != "True":  # torchrun's agent holds the port itself: that is no conflict
            with pytest.raises(ConfigError) as raised:
                check_environment(env)
            message = str(raised.value)
            assert "\n" not in message and f"MASTER_PORT={port}" in message and "in use" in message
        else:
            check_environment(env)
    check_environment({**env, "MASTER_PORT": str(_free_port())})


@pytest.fixture
def no_exec(monkeypatch):
    import grpo_engine.tools.serve as serve

    def execve(*args):
        raise AssertionError("vLLM was started")

    monkeypatch.setattr(serve.os, "execve", execve)


def test_serve_names_a_held_port_before_starting_vllm(held_port, capsys, tmp_path, no_exec):
    assert main(["serve", "--model", str(tmp_path), "--port", str(held_port), "--python", "/bin/false"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"127.0.0.1:{held_port}" in err[0] and "in use" in err[0]


def test_serve_names_a_host_that_is_not_this_machines(capsys, tmp_path, no_exec):
    assert main(["serve", "--model", str(tmp_path), "--host", "192.0.2.1", "--port", "8000"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "192.0.2.1:8000" in err[0]


def test_a_held_nccl_port_is_named_before_the_model_loads(held_port):
    from grpo_engine.rollout.server import check_nccl_port

    config = load_config(None, {"rollout.backend": "vllm_server", "rollout.server.urls": ["http://127.0.0.1:1"],
                                "rollout.server.weight_transfer": "nccl", "rollout.server.nccl_port": held_port})
    with pytest.raises(ConfigError, match=f"rollout.server.nccl_port {held_port}: .*in use"):
        check_nccl_port(config, torch.device("cuda"))
    check_nccl_port(config, torch.device("cuda"), process_index=1)  # only process 0 hosts the group
    free = load_config(None, {"rollout.backend": "vllm_server", "rollout.server.urls": ["http://127.0.0.1:1"],
                              "rollout.server.weight_transfer": "nccl", "rollout.server.nccl_port": _free_port()})
    check_nccl_port(free, torch.device("cuda"))


def test_listen_problem_is_none_for_a_free_port():
    assert listen_problem("", _free_port()) is None
    assert listen_problem("127.0.0.1", _free_port()) is None
