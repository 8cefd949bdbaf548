"""rollout.server.urls: this machine's server listed twice under two of its loopback names (`localhost`,
`127.0.0.1`, `[::1]`, `[::ffff:127.0.0.1]`, the wildcard `0.0.0.0` / `[::]`, in any case, with the DNS root's trailing
dot, an IPv6 address written out) is one line naming both, as any other server listed twice is. Before, each pair
loaded: the one vLLM server was given every weight push twice (under NCCL it joined the transfer group twice, which
never formed). Two ports of this machine are two servers, and another 127.x address is its own host.
The address is read as the system's resolver reads it: the older IPv4 forms (127.1, 2130706433, 0x7f000001, octal),
IPv4 inside IPv6 in any spelling, a zone, a full-width dot, and a name the hosts file lists (localhost.localdomain,
ip6-localhost, the machine's name) passed as another server before."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from hypothesis import given, settings, strategies as st

from grpo_engine.config import ConfigError, load_config, server_url

LOOPBACK_ADDRESSES = ["127.0.0.1", "::1", "0.0.0.0", "::", "::ffff:127.0.0.1"]


def short_ipv4_forms(address: ipaddress.IPv4Address) -> list[str]:
    """The spellings the socket (inet_aton) reads as `address`: fewer parts, one number, hex, octal."""
    a, b, c, d = address.packed
    return [f"{a}.{b}.{c * 256 + d}", f"{a}.{b * 65536 + c * 256 + d}", str(int(address)), hex(int(address)),
            f"{hex(a)}.{b}.{c}.{d}", "0" + oct(int(address))[2:]]
# A hosts file as distributions write it: the loopback aliases, and the machine's name on another line.
HOSTS_LINES = "127.0.0.1 localhost localhost.localdomain\n::1 ip6-localhost ip6-loopback  # IPv6\n127.0.0.1 trainbox\n"
HOSTS_NAMES = ["localhost.localdomain", "ip6-localhost", "ip6-loopback", "trainbox"]


@pytest.fixture(autouse=True, scope="module")
def hosts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("etc") / "hosts"
    path.write_text(HOSTS_LINES)
    before, server_url.HOSTS_FILE = server_url.HOSTS_FILE, path
    yield path
    server_url.HOSTS_FILE = before


def ipv4_forms(draw, address: ipaddress.IPv4Address) -> str:
    """`address` in one of the forms C's inet_aton reads: dotted, or its last parts joined (127.1), each part in
    decimal, 0x-hex or 0-octal."""
    octets = list(address.packed)
    parts = draw(st.integers(1, 4))
    numbers = octets[:parts - 1] + [int.from_bytes(bytes(octets[parts - 1:]), "big")]
    base = draw(st.sampled_from(["dec", "hex", "oct"]))
    return ".".join(str(n) if base == "dec" or n == 0 else hex(n) if base == "hex" else "0" + oct(n)[2:]
                    for n in numbers)


@st.composite
def loopback_hosts(draw) -> str:
    """One spelling of this machine in a URL's host part."""
    kind = draw(st.sampled_from(["name", "address", "hosts file"]))
    if kind == "name":
        name = "".join(c.upper() if draw(st.booleans()) else c for c in "localhost")
        return name + draw(st.sampled_from(["", ".", "\uff0e"]))
    if kind == "hosts file":
        return draw(st.sampled_from(HOSTS_NAMES)) + "." * draw(st.booleans())
    address = ipaddress.ip_address(draw(st.sampled_from(LOOPBACK_ADDRESSES)))
    if address.version == 4:
        if draw(st.booleans()):  # inside IPv6, as an IPv4-mapped address in either notation
            mapped = ipaddress.IPv6Address(b"\0" * 10 + b"\xff" * 2 + address.packed)
            return f"[{mapped.exploded if draw(st.booleans()) else mapped.compressed}]"
        return ipv4_forms(draw, address)
    zone = "%lo" if draw(st.booleans()) else ""
    return f"[{address.exploded if draw(st.booleans()) else address.compressed}{zone}]"


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
@pytest.mark.parametrize("host", ["127.0.0.2", "0x7f000002", "127.2", "[::ffff:127.0.0.2]", "trainbox2"])
def test_another_address_in_any_form_is_its_own_host(host):
    assert len(load(["http://127.0.0.1:8000", f"http://{host}:8000"]).rollout.server.urls) == 2


def test_the_older_ipv4_forms_are_read_as_the_resolver_reads_them():
    for form in ("127.1", "2130706433", "0x7f000001", "0177.0.0.1", "0"):
        resolved = socket.getaddrinfo(form, 80, socket.AF_INET)[0][4][0]
        assert server_url.host_address(form) == ipaddress.ip_address(resolved)
