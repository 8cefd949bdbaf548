"""How a request reaches a rollout server, whatever the environment and the server's answers say about the route:

- proxy variables (`http_proxy` / `HTTP_PROXY` / `https_proxy`, `no_proxy` unset or naming something else): a server on
  this machine (any loopback spelling) is reached directly, never through the proxy; another host's requests go
  through it and a failure names it. Before: a loopback server's requests went to the proxy, whose own answer (here
  another "server"'s model) came back as the server's, and a dead proxy was reported as the server refusing.
- a redirect (301 / 302 / 303 / 307 / 308, GET or POST): one line naming where it points, nothing sent there. Before:
  followed to any host, a POST turned into a GET without its body.
- a TLS failure (https:// to a plain-HTTP server, a certificate not trusted here): one line at once saying what to
  do, not retried for rollout.server.timeout_s and not "did not answer". At start each is the cause in
  check_servers_up's line, as is a server that answers /health but lists no models (not vLLM's), and a
  max_model_len that is not a number (which skipped the length check).
- 408 / 429 (a server's own timeout, a gateway's throttle): retried like 503, not the end of the run.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.config import ConfigError, load_config
from grpo_engine.rollout.http_client import ServerClient, ServerRequestError, ServerUnavailable, ServerUnreachable
from grpo_engine.rollout.server import check_servers_up, served_model_name
from tests.support import misbehaving_server as servers

MODELS = json.dumps({"data": [{"id": "served"}]}).encode()
PROXY_VARIABLES = ["http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY", "all_proxy",
                   "ALL_PROXY"]


def http_answer(status: int, body: bytes = b"", headers: str = "") -> bytes:
    return servers.response(status, body, headers=headers)


def dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture()
def clean_proxies(monkeypatch):
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=25, deadline=None)
@given(host=st.sampled_from(["127.0.0.1", "localhost", "LocalHost", "127.1", "2130706433", "0x7f.0.0.1"]),
       variable=st.sampled_from(["http_proxy", "HTTP_PROXY"]),
       no_proxy=st.sampled_from([None, "", "example.com", "localhost", "10.0.0.0/8"]),
       live=st.booleans())
def test_this_machine_is_reached_directly_whatever_the_proxy_variables(clean_proxies, host, variable, no_proxy, live):
    with servers.MisbehavingServer(servers.answer(200, MODELS)) as server, \
            servers.MisbehavingServer(servers.answer(200, json.dumps({"data": [{"id": "proxy"}]}).encode())) as proxy:
        with pytest.MonkeyPatch.context() as env:
            env.setenv(variable, proxy.url if live else f"http://127.0.0.1:{dead_port()}")
            if no_proxy is not None:
                env.setenv("NO_PROXY", no_proxy)
            url = server.url.replace("127.0.0.1", host)
            assert served_model_name(ServerClient(url, 0.0, 2.0)) == "served"


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=10, deadline=None)
@given(variable=st.sampled_from(["http_proxy", "HTTP_PROXY"]), credentials=st.sampled_from(["", "user:secret@"]))
def test_a_failure_through_a_proxy_names_it(clean_proxies, variable, credentials):
    port = dead_port()
    with pytest.MonkeyPatch.context() as env:
        env.setenv(variable, f"http://{credentials}127.0.0.1:{port}")
        with pytest.raises(ServerUnavailable) as raised:
            ServerClient("http://rollout-node.invalid:8000", 0.0, 2.0).get("/v1/models")
    message = str(raised.value)
    assert f"through the proxy http://127.0.0.1:{port}" in message and "NO_PROXY" in message, message
    assert "secret" not in message and "\n" not in message, message


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=20, deadline=None)
@given(code=st.sampled_from([301, 302, 303, 307, 308]), post=st.booleans(), to_path=st.booleans())
def test_a_redirect_is_named_not_followed(clean_proxies, code, post, to_path):
    target = servers.routed(lambda method, path: http_answer(200, MODELS))
    with servers.MisbehavingServer(target) as elsewhere:
        location = elsewhere.url + ("/v1/models" if to_path else "")
        redirecting = servers.routed(lambda method, path: http_answer(code, b"moved", f"Location: {location}\r\n"))
        with servers.MisbehavingServer(redirecting) as server:
            client = ServerClient(server.url, 1.0, 2.0)
            with pytest.raises(ServerRequestError) as raised:
                client.post("/v1/completions", {"prompt": [1]}) if post else client.get("/v1/models")
            reason = client.down_reason()
    message = str(raised.value)
    assert f"HTTP {code} redirecting to {location}" in message and "rollout.server.urls" in message, message
    assert server.url in message and "\n" not in message, message
    assert target.asked == []
    assert reason is not None and reason.startswith(f"HTTP {code} redirecting to {location}"), reason


def plain_http_400(conn: socket.socket, stop) -> None:
    """What a plain-HTTP server (uvicorn) answers to bytes that are not HTTP, such as a TLS hello."""
    conn.settimeout(5.0)
    conn.recv(65536)
    conn.sendall(http_answer(400, b"Invalid HTTP request received."))


def test_https_to_a_plain_http_server_is_said_at_once(clean_proxies):
    with servers.MisbehavingServer(plain_http_400) as server:
        url = server.url.replace("http://", "https://")
        started = time.monotonic()
        with pytest.raises(ServerUnreachable) as raised:
            ServerClient(url, 30.0, 5.0).get("/v1/models")  # not retried for the 30 s
        assert time.monotonic() - started < 5.0
        config = load_config(None, {"rollout.backend": "vllm_server", "rollout.server.urls": [url]})
        with pytest.raises(ConfigError) as at_start:
            check_servers_up(config)
    for message in (str(raised.value), str(at_start.value)):
        assert url in message and "plain-HTTP server? then write http://" in message and "\n" not in message


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: no certificate to serve")
    directory = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(directory / "key.pem"),
                    "-out", str(directory / "cert.pem"), "-days", "2", "-subj", "/CN=localhost"],
                   check=True, capture_output=True)
    return directory / "cert.pem", directory / "key.pem"


@pytest.mark.parametrize("trusted", [False, True])
def test_a_certificate_not_trusted_here_is_said_at_once(clean_proxies, self_signed, trusted):
    """Not trusted: its CA is not known here. Trusted (SSL_CERT_FILE names it) but issued for `localhost` while the URL
    says 127.0.0.1: the name is what to change, not the CA bundle."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*map(str, self_signed))

    def tls(conn: socket.socket, stop) -> None:
        try:
            context.wrap_socket(conn, server_side=True).recv(65536)
        except (OSError, ssl.SSLError):
            pass

    if trusted:
        clean_proxies.setenv("SSL_CERT_FILE", str(self_signed[0]))
    with servers.MisbehavingServer(tls) as server:
        url = server.url.replace("http://", "https://")
        started = time.monotonic()
        with pytest.raises(ServerUnreachable) as raised:
            ServerClient(url, 30.0, 5.0).get("/v1/models")
        assert time.monotonic() - started < 5.0
    message = str(raised.value)
    expected = "certificate is issued for another name" if trusted else "certificate is not trusted here"
    assert url in message and expected in message and "\n" not in message, message


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=8, deadline=None)
@given(status=st.sampled_from([408, 429]), times=st.integers(1, 2))
def test_a_throttle_is_retried(clean_proxies, status, times):
    answers = iter([http_answer(status, b"slow down")] * times)
    throttling = servers.routed(lambda method, path: next(answers, http_answer(200, MODELS)))
    with servers.MisbehavingServer(throttling) as server:
        assert served_model_name(ServerClient(server.url, 5.0, 2.0)) == "served"


@pytest.mark.parametrize("answers, expected", [
    (lambda method, path: http_answer(200, b"{}") if path == "/health" else http_answer(404, b'{"detail":"Not Found"}'),
     "does not list its models"),
    (lambda method, path: http_answer(200, json.dumps({"data": [{"id": "m", "max_model_len": "16"}]}).encode()),
     "with a str for a int at ['data'][0]['max_model_len']"),
])
def test_a_server_that_is_not_vllms_is_named_at_start(clean_proxies, answers, expected):
    with servers.MisbehavingServer(servers.routed(answers)) as server:
        config = load_config(None, {"rollout.backend": "vllm_server", "rollout.server.urls": [server.url],
                                    "rollout.max_new_tokens": 64})
        with pytest.raises((ConfigError, ValueError)) as raised:
            check_servers_up(config)
    message = str(raised.value)
    assert server.url in message and expected in message and "\n" not in message, message
