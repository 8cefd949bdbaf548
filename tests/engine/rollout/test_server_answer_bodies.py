"""A rollout server's answer body is read strictly, in one place: a key given twice, JSON nested past Python's
recursion limit, an integer of more digits than any the API sends, a Content-Encoding the client did not ask for
(decoded when gzip / deflate, named otherwise) or a body that is not what its encoding says. Each drawn case is one
line naming the server and the request; the same answer well formed (gzip'd or not) reads as its JSON. Before: the
last duplicate won without a word, deep nesting was a RecursionError naming nothing, a long integer made the whole
answer "not JSON" (then "without ['data']"), and a gzip body was read as text."""

from __future__ import annotations

import gzip
import json
import zlib

from hypothesis import given, settings, strategies as st

from grpo_engine.rollout.answer_body import MAX_INT_DIGITS
from grpo_engine.rollout.http_client import ServerAnswerError, ServerClient
from tests.support import misbehaving_server as servers

ANSWERS = st.fixed_dictionaries({"object": st.just("list"), "data": st.lists(st.fixed_dictionaries(
    {"id": st.text(min_size=1, max_size=8), "max_model_len": st.integers(1, 10**9)}), min_size=1, max_size=3)})
ENCODERS = {"gzip": gzip.compress, "x-gzip": gzip.compress, "deflate": zlib.compress, "identity": lambda b: b,
            "": lambda b: b}


def serve(body: bytes, encoding: str = "") -> servers.Behaviour:
    head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            + (f"Content-Encoding: {encoding}\r\n" if encoding else "") + "Connection: close\r\n\r\n").encode()
    return servers.raw_bytes(head + body)


@st.composite
def broken_bodies(draw) -> tuple[bytes, str, str]:
    """(body, Content-Encoding, what the line says)."""
    answer = json.dumps(draw(ANSWERS))
    kind = draw(st.sampled_from(["twice", "deep", "long int", "encoding", "not encoded"]))
    if kind == "twice":
        key = draw(st.sampled_from(["data", "id", "object"]))
        doubled = answer.replace(f'"{key}": ', f'"{key}": 0, "{key}": ', 1)
        return doubled.encode(), "", f"gives the key '{key}' twice"
    if kind == "deep":
        depth = draw(st.integers(10**5, 3 * 10**5))
        return b'{"data": ' + b"[" * depth + b"]" * depth + b"}", "", "nested too deep"
    if kind == "long int":
        digits = draw(st.integers(MAX_INT_DIGITS + 1, 6000))
        sign = draw(st.sampled_from(["", "-"]))
        return answer.replace('"max_model_len": ', f'"max_model_len": {sign}{"9" * digits}, "x": ', 1).encode(), "", \
            f"integer of {digits} digits"
    if kind == "encoding":
        return answer.encode(), draw(st.sampled_from(["br", "zstd", "compress", "gzip, br"])), "does not decode"
    return answer.encode(), draw(st.sampled_from(["gzip", "deflate"])), "is not"


@settings(max_examples=40, deadline=None)
@given(case=broken_bodies())
def test_a_body_broken_past_its_json_shape_is_one_line(case):
    body, encoding, said = case
    with servers.MisbehavingServer(serve(body, encoding)) as server:
        try:
            ServerClient(server.url, 0.0, 5.0).get("/v1/models")
        except ServerAnswerError as exc:
            message = str(exc)
        else:
            raise AssertionError(f"read without a word: {body[:80]!r} ({encoding})")
    assert server.url in message and "GET /v1/models" in message and said in message, message
    assert "\n" not in message and len(message) < 400, message


@settings(max_examples=30, deadline=None)
@given(answer=ANSWERS, encoding=st.sampled_from(sorted(ENCODERS)))
def test_a_well_formed_body_reads_as_its_json_whatever_its_encoding(answer, encoding):
    body = ENCODERS[encoding](json.dumps(answer).encode())
    with servers.MisbehavingServer(serve(body, encoding)) as server:
        assert ServerClient(server.url, 0.0, 5.0).get("/v1/models") == answer
