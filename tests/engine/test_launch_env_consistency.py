"""The launch variables together: a WORLD_SIZE above 1 comes with the RANK, MASTER_ADDR and MASTER_PORT every
launcher sets with it, a machine's share (LOCAL_WORLD_SIZE, LOCAL_RANK) is within the whole (WORLD_SIZE, RANK),
and MASTER_ADDR names a host. Drawn combinations are accepted exactly when they hold together, else refused in one
line naming a variable, before anything loads. Before, each of these waited in torch's rendezvous for the process
group's whole timeout (30 minutes). A LOCAL_RANK without WORLD_SIZE (left from another launch) and an MPI
launcher's process count (PMI_SIZE, OMPI_COMM_WORLD_SIZE, MV2_COMM_WORLD_SIZE: accelerate's on the CPU) without
MASTER_ADDR made accelerate start a process group that failed after the imports, naming MASTER_ADDR only."""

from __future__ import annotations

import socket

from hypothesis import given, settings, strategies as st

from grpo_engine.config import ConfigError
from grpo_engine.launch_env import check_environment

NUMBERS = st.integers(0, 5).map(str)
HOSTS = st.sampled_from(["127.0.0.1", "localhost", "::1", "nowhere.invalid", "no host.invalid", "   "])


MPI = (("PMI_SIZE", "PMI_RANK"), ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
       ("MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK"))  # accelerate's order


@st.composite
def launch_environments(draw) -> dict[str, str]:
    names = {"WORLD_SIZE": NUMBERS, "RANK": NUMBERS, "LOCAL_WORLD_SIZE": NUMBERS, "LOCAL_RANK": NUMBERS,
             "MASTER_ADDR": HOSTS, "MASTER_PORT": st.integers(1, 65535).map(str),
             **{name: NUMBERS for pair in MPI for name in pair}}
    present = draw(st.sets(st.sampled_from(sorted(names))))
    return {name: draw(names[name]) for name in present}


def _holds_together(env: dict[str, str]) -> bool:
    number = {k: int(v) for k, v in env.items() if k not in ("MASTER_ADDR",)}
    if any(number.get(size) == 0 for size in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", *(size for size, _ in MPI))):
        return False
    for smaller, larger, strictly in (("RANK", "WORLD_SIZE", True), ("LOCAL_RANK", "LOCAL_WORLD_SIZE", True),
                                      ("LOCAL_WORLD_SIZE", "WORLD_SIZE", False), ("LOCAL_RANK", "RANK", False),
                                      *((rank, size, True) for size, rank in MPI)):
        if smaller in number and larger in number and (
                number[smaller] >= number[larger] if strictly else number[smaller] > number[larger]):
            return False
    if "LOCAL_RANK" in env and "WORLD_SIZE" not in env:  # accelerate would start a process group all the same
        return False
    if number.get("WORLD_SIZE", 1) > 1:
        return all(name in env for name in ("RANK", "MASTER_ADDR", "MASTER_PORT")) and \
            env["MASTER_ADDR"] in ("127.0.0.1", "localhost", "::1") and \
            (number["RANK"] != 0 or _can_listen(number["MASTER_PORT"]))  # rank 0 hosts the rendezvous there
    mpi_size = next((number[size] for size, _ in MPI if size in number), 1)
    if "WORLD_SIZE" not in env and mpi_size > 1:  # on the CPU, accelerate's processes meet at MASTER_ADDR
        return env.get("MASTER_ADDR") in ("127.0.0.1", "localhost", "::1")
    return True


def _can_listen(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


@settings(max_examples=300, deadline=None)
@given(env=launch_environments())
def test_launch_variables_are_accepted_exactly_when_they_hold_together(env):
    try:
        check_environment(env)
    except ConfigError as exc:
        message = str(exc)
        assert not _holds_together(env), message
        assert "\n" not in message and "environment variable " in message, message
        assert any(f"{name}=" in message or f"{name} " in message for name in env), message
    else:
        assert _holds_together(env), env
