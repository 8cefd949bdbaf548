"""A rollout server that accepts the connection and then misbehaves: never answers, answers bytes that are not
HTTP, sends its answer a byte at a time (each byte within the socket timeout), sends a body that never ends, cuts
its body short, or answers JSON of another shape. Each drawn case ends within rollout.server.request_timeout_s
(per attempt) plus rollout.server.timeout_s (retries) in one line naming the URL, never a hang and never a
TypeError or KeyError from inside the backend. Before: a trickled answer took as long as the server liked, an
endless body never ended (and filled memory), garbage was http.client's BadStatusLine with a traceback, and a
wrong shape a KeyError or TypeError."""

from __future__ import annotations

import json
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from grpo_engine.rollout import http_client
from grpo_engine.rollout.completion_answer import CompletionAsk
from grpo_engine.rollout.http_client import ServerAnswerError, ServerClient, ServerRequestError, ServerUnavailable
from grpo_engine.rollout.server import VLLMServerRollout, served_model_name
from tests.support import misbehaving_server as servers

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
                        ["data", "id", "choices", "logprobs", "tokens", "token_logprobs", "x"]), inner, max_size=3),
                    max_leaves=8)
NOT_HTTP = st.binary(min_size=1, max_size=200).filter(lambda b: not b.startswith(b"HTTP/"))


@st.composite
def misbehaviours(draw):
    kind = draw(st.sampled_from(["silent", "not http", "trickle", "endless", "cut", "json", "not json", "status"]))
    if kind == "silent":
        return kind, servers.silent
    if kind == "not http":
        return kind, servers.raw_bytes(draw(NOT_HTTP))
    if kind == "trickle":
        body = json.dumps({"data": [{"id": "m"}]}).encode()
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        return kind, servers.trickle(head + body, draw(st.floats(0.01, 0.08)))
    if kind == "endless":
        return kind, servers.endless_body
    if kind == "cut":
        return kind, servers.cut_body
    if kind == "json":
        return kind, servers.answer(200, json.dumps(draw(JSON)).encode())
    if kind == "not json":
        return kind, servers.answer(200, draw(st.binary(max_size=60)), "text/html")
    return kind, servers.answer(draw(st.sampled_from([400, 404, 500, 502, 503])), b"oops")


def _ends_in_one_line(call, url: str, bound_s: float):
    """What `call()` returned, or raised, checked to end within bound_s and, if raised, in one line naming url."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(("returned", call()))
        except BaseException as exc:  # every exception is checked below
            outcome.append(("raised", exc))

    started = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(bound_s + 3.0)
    assert not worker.is_alive(), f"no end after {bound_s + 3.0:.1f} s"
    assert time.monotonic() - started <= bound_s + 1.5, time.monotonic() - started
    how, value = outcome[0]
    if how == "raised":
        assert isinstance(value, (ServerUnavailable, ServerAnswerError, ServerRequestError)), repr(value)
        assert url in str(value) and "\n" not in str(value), str(value)
    return how, value


@settings(max_examples=45, deadline=None)
@given(case=misbehaviours(), request_timeout_s=st.floats(0.2, 0.5), retry_for_s=st.floats(0.0, 0.4))
def test_a_misbehaving_server_is_one_line_within_its_timeouts(case, request_timeout_s, retry_for_s):
    kind, behaviour = case
    with pytest.MonkeyPatch.context() as monkeypatch, servers.MisbehavingServer(behaviour) as server:
        monkeypatch.setattr(http_client, "MAX_ANSWER_BYTES", 2**20)  # an endless body passes it in milliseconds
        client = ServerClient(server.url, retry_for_s, request_timeout_s)
        # each attempt takes at most request_timeout_s; they go on until retry_for_s has passed, with one backoff
        bound = 2 * request_timeout_s + retry_for_s + http_client.FIRST_BACKOFF_S
        how, value = _ends_in_one_line(lambda: served_model_name(client), server.url, bound)
    if how == "returned":
        assert kind == "json" and isinstance(value, str)
    if kind in ("silent", "trickle", "not http", "cut"):
        assert isinstance(value, ServerUnavailable), (kind, value)


@settings(max_examples=60, deadline=None)
@given(answer=JSON)
def test_a_completion_answer_of_another_shape_names_the_field(answer):
    with servers.MisbehavingServer(servers.answer(200, json.dumps(answer).encode())) as server:
        rollout = object.__new__(VLLMServerRollout)  # only its client is used by _choice
        rollout.client = ServerClient(server.url, 0.0, 2.0)
        ask = CompletionAsk(max_tokens=8, vocab_size=100, sampled=True)
        how, value = _ends_in_one_line(lambda: rollout._choice({"prompt": [1]}, ask), server.url, 2.0)
    if how == "returned":
        ids, logprobs = value
        assert 1 <= len(ids) == len(logprobs) <= 8
    else:
        assert isinstance(value, ServerAnswerError) and "POST /v1/completions" in str(value)
