"""rollout.server.urls: a URL the HTTP client would mistake (the OpenAI clients' /v1 base or any API path the engine
adds itself, such as an endpoint's URL pasted from a curl example, `.../v1/completions`, `.../health`; a query or
fragment, user:password@, no host, a port 0, past 65535 or not a number, an IPv6 literal left open; a control
character, a path outside ASCII or with a % that starts no escape, an API path percent-encoded (/v%31), an IPv6 zone
id naming no interface of this machine or written %25) and a server listed twice in two spellings (the host's case,
a default port, a trailing slash, an IPv6 address written out, a name with the DNS root's trailing dot, an
internationalised name in its ASCII form) are one line naming the setting when the config loads. Before: each passed
the schema and failed later naming something else (GET /v1/v1/models 404, the host `user` not found, a connection
error after the model loaded, a UnicodeEncodeError naming nothing), and a server listed twice took every weight
push twice. Well-formed URLs (a path prefix, https, an IPv6 literal) load as written, less a trailing slash."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings, strategies as st

from grpo_engine.config import ConfigError, load_config

HOSTS = st.from_regex(r"\A[a-z][a-z0-9-]{0,12}(\.[a-z][a-z0-9-]{0,8}){0,2}\Z") | st.sampled_from(
    ["127.0.0.1", "10.0.0.2", "[::1]", "[fe80::1]", "[2001:db8::8:800:200c:417a]", "bücher.example", "例え.jp"])
# What the engine adds to a base URL itself: the OpenAI API under /v1 and the server's own endpoints.
API_PATHS = st.sampled_from(["/v1", "/V1", "/v1/completions", "/v1/models", "/v1/chat/completions", "/health",
                             "/metrics", "/collective_rpc", "/reset_prefix_cache", "/version"])


@st.composite
def base_urls(draw) -> str:
    scheme = draw(st.sampled_from(["http", "https"]))
    port = draw(st.none() | st.integers(1, 65535))
    path = draw(st.sampled_from(["", "/vllm", "/a/b"]))
    return f"{scheme}://{draw(HOSTS)}{'' if port is None else f':{port}'}{path}"


def load(urls: list[str]):
    return load_config(None, {"rollout.backend": "vllm_server", "rollout.server.urls": urls})


@settings(max_examples=150, deadline=None)
@given(url=base_urls(), slash=st.booleans())
def test_a_base_url_loads_as_written(url, slash):
    assert load([url + "/" * slash]).rollout.server.urls == [url]


def test_a_zone_id_naming_an_interface_of_this_machine_loads():
    for index, name in socket.if_nameindex():
        for zone in (name, str(index)):
            assert load([f"http://[fe80::1%{zone}]:8000"]).rollout.server.urls == [f"http://[fe80::1%{zone}]:8000"]


@st.composite
def mistaken_urls(draw) -> str:
    url = draw(base_urls())
    scheme, _, rest = url.partition("://")
    host_port = rest.split("/")[0]
    kind = draw(st.sampled_from(["v1", "query", "fragment", "credentials", "port", "no host", "open ipv6", "control",
                                 "not ascii", "bad escape", "encoded api", "zone"]))
    if kind == "v1":
        return url + draw(API_PATHS) + draw(st.sampled_from(["", "/"]))
    if kind == "query":
        return url + "?" + draw(st.sampled_from(["", "x=1", "api_key=k"]))
    if kind == "fragment":
        return url + "#" + draw(st.sampled_from(["", "x"]))
    if kind == "control":  # anywhere after the scheme; none that the whitespace check catches already
        at = draw(st.integers(len(scheme) + 3, len(url)))
        return url[:at] + chr(draw(st.sampled_from([*range(0, 9), *range(14, 28), 127]))) + url[at:]
    if kind == "not ascii":
        return url + "/" + draw(st.text(st.characters(min_codepoint=128, categories=("L", "N", "S")), min_size=1,
                                        max_size=4))
    if kind == "bad escape":
        return url + "/a%" + draw(st.sampled_from(["", "z", "zz", "4", "g1", "%41"]))
    if kind == "encoded api":  # an API path the server decodes: /v%31 is /v1
        segment = draw(st.sampled_from(["v1", "health", "metrics"]))
        at = draw(st.integers(0, len(segment) - 1))
        return f"{url}/{segment[:at]}%{ord(segment[at]):02{draw(st.sampled_from(['x', 'X']))}}{segment[at + 1:]}"
    if kind == "zone":  # no interface of this machine, or RFC 6874's %25 spelling of one
        names = [name for _, name in socket.if_nameindex()]
        zone = draw(st.sampled_from(["25" + names[0], "no-such-if0", "25" + names[-1]]).filter(
            lambda z: z not in names))
        return f"{scheme}://[fe80::1%{zone}]:{draw(st.integers(1, 65535))}"
    if kind == "credentials":
        return f"{scheme}://{draw(st.sampled_from(['u:p@', 'user@', ':@']))}{rest}"
    host = host_port.rsplit(":", 1)[0] if not host_port.endswith("]") else host_port
    if kind == "port":
        port = draw(st.sampled_from(["0", "", "abc", "8o00"]) | st.integers(65536, 10**8).map(str))
        return f"{scheme}://{host}:{port}"
    if kind == "no host":
        return f"{scheme}://:{draw(st.integers(1, 65535))}"
    return f"{scheme}://[::1:{draw(st.integers(1, 65535))}"


@settings(max_examples=150, deadline=None)
@given(url=mistaken_urls(), index=st.integers(0, 1))
def test_a_url_the_client_would_mistake_is_one_line_naming_it(url, index):
    urls = ["http://good-host:8000"]
    urls.insert(index, url)
    with pytest.raises(ConfigError) as raised:
        load(urls)
    message = str(raised.value)
    assert message.startswith(f"rollout.server.urls[{index}]: expected a server's base URL") and "\n" not in message


@settings(max_examples=100, deadline=None)
@given(url=base_urls(), respell=st.sets(st.sampled_from(["case", "port", "slash", "address"]), min_size=1),
       other=base_urls())
def test_a_server_listed_twice_is_named(url, respell, other):
    parts = urlsplit(url)
    netloc = parts.netloc
    if "address" in respell:  # another spelling of the same address, which DNS or the socket reads as the same
        host = parts.hostname
        try:
            address = ipaddress.ip_address(host)
            spelled = f"[{address.exploded}]" if address.version == 6 else host
        except ValueError:
            spelled = (host.encode("idna").decode() if not host.isascii() else host) + "."
        netloc = spelled + netloc[netloc.rindex("]") + 1 if "]" in netloc else len(host):]
    netloc = netloc.upper() if "case" in respell else netloc  # a host name has no case
    if "port" in respell and parts.port is None:
        netloc += ":80" if parts.scheme == "http" else ":443"
    twice = f"{parts.scheme}://{netloc}{parts.path}" + "/" * ("slash" in respell)
    # the loopback names of this machine are one host (test_server_url_loopback.py)
    distinct = urlsplit(other).hostname != parts.hostname and not {urlsplit(other).hostname, parts.hostname} <= {
        "127.0.0.1", "::1"}
    urls = [url, other, twice] if distinct else [url, twice]
    with pytest.raises(ConfigError) as raised:
        load(urls)
    message = str(raised.value)
    assert message.startswith("rollout.server.urls: expected each server once") and "\n" not in message, message
    assert f"[{len(urls) - 1}]" in message and "[0]" in message
