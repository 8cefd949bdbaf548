"""rollout.server.urls: this machine's server listed twice under two of its loopback names (`localhost`,
`127.0.0.1`, `[::1]`, `[::ffff:127.0.0.1]`, the wildcard `0.0.0.0` / `[::]`, in any case, with the DNS root's trailing
dot, an IPv6 address written out) is one line naming both, as any other server listed twice is. Before, each pair
loaded: the one vLLM server was given every weight push twice (under NCCL it joined the transfer group twice, which
never formed). Two ports of this machine are two servers, and another 127.x address is its own host."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings, strategies as st

from grpo_engine.config import ConfigError, load_config

LOOPBACK_ADDRESSES = ["127.0.0.1", "::1", "0.0.0.0", "::", "::ffff:127.0.0.1"]


@st.composite
def loopback_hosts(draw) -> str:
    """One spelling of this machine in a URL's host part."""
    if draw(st.booleans()):
        name = "".join(c.upper() if draw(st.booleans()) else c for c in "localhost")
        return name + "." * draw(st.booleans())
    address = ipaddress.ip_address(draw(st.sampled_from(LOOPBACK_ADDRESSES)))
    if address.version == 4:
        return str(address)
    return f"[{address.exploded if draw(st.booleans()) else address.compressed}]"


def load(urls: list[str]):
    return load_config(None, {"rollout.backend": "vllm_server", "rollout.server.urls": urls})


@settings(max_examples=100, deadline=None)
@given(first=loopback_hosts(), second=loopback_hosts(), port=st.integers(1, 65535),
       path=st.sampled_from(["", "/vllm"]))
def test_this_machine_under_two_loopback_names_is_one_server(first, second, port, path):
    urls = [f"http://{first}:{port}{path}", f"http://{second}:{port}{path}/"]
    with pytest.raises(ConfigError) as raised:
        load(urls)
    message = str(raised.value)
    assert message.startswith("rollout.server.urls: expected each server once") and "\n" not in message, message
    assert "[1] http://" in message and "[0] http://" in message and "(both name this machine)" in message


@settings(max_examples=30, deadline=None)
@given(first=loopback_hosts(), second=loopback_hosts(), port=st.integers(1, 65534))
def test_two_ports_of_this_machine_are_two_servers(first, second, port):
    config = load([f"http://{first}:{port}", f"http://{second}:{port + 1}"])
    assert len(config.rollout.server.urls) == 2


def test_another_loopback_address_is_its_own_host():
    assert len(load(["http://127.0.0.1:8000", "http://127.0.0.2:8000"]).rollout.server.urls) == 2
