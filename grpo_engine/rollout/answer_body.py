"""A rollout server's answer body decoded: its Content-Encoding undone, then JSON read strictly, or its text.

json.loads alone took the last of a key given twice (`{"id": "a", "id": "b"}`: which one the server meant is
unknown), raised RecursionError on a deeply nested array (a traceback naming no server), and refused an integer of
more than 4300 digits with a ValueError that made the whole answer "not JSON"; a gzip body (a proxy compressing) was
read as text. Each is now what `AnswerProblem` says, which the client turns into one line naming the server.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

# Integers in the API's answers are token ids, counts and lengths: far below 30 digits.
MAX_INT_DIGITS = 30
# zlib's window bits for each Content-Encoding it decodes: gzip's header, zlib's, or a raw deflate stream.
_WINDOW_BITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class AnswerProblem(Exception):
    """What is wrong with a body, as a clause: "with JSON that gives the key 'id' twice"."""


def decoded(body: bytes, content_encoding: str, max_bytes: int) -> Any:
    """The JSON `body` holds (the text of one that is not JSON, None for an empty body), its encoding undone."""
    body = _undone(body, content_encoding.strip().lower(), max_bytes)
    if not body.strip():
        return None
    try:
        return json.loads(body, object_pairs_hook=_unique_keys, parse_int=_bounded_int)
    except RecursionError:
        raise AnswerProblem("with JSON nested too deep to read") from None
    except ValueError:  # vLLM answers some calls (/v1/load_lora_adapter) with plain text
        return body.decode(errors="replace")


def _undone(body: bytes, encoding: str, max_bytes: int) -> bytes:
    if encoding in ("", "identity"):
        return body
    if encoding not in _WINDOW_BITS:
        raise AnswerProblem(f"with Content-Encoding {encoding!r}, which the client does not decode (it asks for none)")
    inflater = zlib.decompressobj(_WINDOW_BITS[encoding])
    try:
        plain = inflater.decompress(body, max_bytes + 1)  # a small body may inflate without end
    except zlib.error as exc:
        raise AnswerProblem(f"with a body that is not {encoding} as its Content-Encoding says ({exc})") from None
    if len(plain) > max_bytes:
        raise AnswerProblem(f"with a {encoding} body that inflates past {max_bytes} bytes")
    return plain


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise AnswerProblem(f"with JSON that gives the key {key!r} twice (which one is meant is unknown)")
        seen[key] = value
    return seen


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise AnswerProblem(f"with a JSON integer of {len(text.lstrip('-'))} digits")
    return int(text)
