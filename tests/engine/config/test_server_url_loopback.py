"""rollout.server.urls: this machine's server listed twice under two of its loopback names (`localhost`,
`127.0.0.1`, `[::1]`, `[::ffff:127.0.0.1]`, the wildcard `0.0.0.0` / `[::]`, in any case, with the DNS root's trailing
dot, an IPv6 address written out, a short IPv4 form such as `127.1` or `2130706433`) is one line naming both, as any
other server listed twice is. Before, each pair loaded: the one vLLM server was given every weight push twice (under
NCCL it joined the transfer group twice, which never formed). Two ports of this machine are two servers, and another
127.x address is its own host. Any IPv4 address in a short form (`1.2.3`, the socket's 1.2.0.3) is that address."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings, strategies as st

from grpo_engine.config import ConfigError, load_config

LOOPBACK_ADDRESSES = ["127.0.0.1", "::1", "0.0.0.0", "::", "::ffff:127.0.0.1"]


def short_ipv4_forms(address: ipaddress.IPv4Address) -> list[str]:
    """The spellings the socket (inet_aton) reads as `address`: fewer parts, one number, hex, octal."""
    a, b, c, d = address.packed
    return [f"{a}.{b}.{c * 256 + d}", f"{a}.{b * 65536 + c * 256 + d}", str(int(address)), hex(int(address)),
            f"{hex(a)}.{b}.{c}.{d}", "0" + oct(int(address))[2:]]


@st.composite
def loopback_hosts(draw) -> str:
    """One spelling of this machine in a URL's host part."""
    if draw(st.booleans()):
        name = "".join(c.upper() if draw(st.booleans()) else c for c in "localhost")
        return name + "." * draw(st.booleans())
    address = ipaddress.ip_address(draw(st.sampled_from(LOOPBACK_ADDRESSES)))
    if address.version == 4:
        return draw(st.sampled_from([str(address), *short_ipv4_forms(address)]))
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


@settings(max_examples=40, deadline=None)
@given(packed=st.binary(min_size=4, max_size=4), port=st.integers(1, 65535), form=st.integers(0, 5))
def test_a_short_ipv4_form_is_its_address(packed, port, form):
    """`1.2.3` is the socket's 1.2.0.3, `2130706433` its 127.0.0.1: listed beside the dotted form, one server."""
    address = ipaddress.IPv4Address(packed)
    short = short_ipv4_forms(address)[form]
    with pytest.raises(ConfigError) as raised:
        load([f"http://{address}:{port}", f"http://{short}:{port}"])
    assert str(raised.value).startswith("rollout.server.urls: expected each server once"), str(raised.value)
