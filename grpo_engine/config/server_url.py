"""rollout.server.urls: each a vLLM server's base URL the HTTP client can reach as written, and no server twice.

The client joins the base URL with the API's paths (`/health`, `/v1/completions`), so what the former pattern let
through failed later, naming something else: `http://host:8000/v1` (the OpenAI clients' base URL) asked for
`/v1/v1/models`; a query or fragment swallowed the paths; `http://user:pass@host` failed to resolve the host
`user`; a port past 65535 or not a number was a connection error after the model had loaded. A server listed twice
was given every weight push twice and, under NCCL, joined the transfer group twice, which then never formed.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

EXPECTED = "expected a server's base URL, http://HOST:PORT"
DEFAULT_PORTS = {"http": 80, "https": 443}


def server_url(url: str) -> str:
    """The URL without a trailing slash; ValueError in one clause for one the client would mistake."""
    if not re.fullmatch(r"https?://[^/\s]+(/[^\s]*)?", url):
        raise ValueError(EXPECTED)
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an IPv6 literal without its closing bracket
        raise ValueError(f"{EXPECTED}: {exc}") from None
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise ValueError(f"{EXPECTED}, without a query or fragment (? or #)")
    if "@" in parts.netloc:
        raise ValueError(f"{EXPECTED}, without user:password@ (the client sends no credentials)")
    try:
        port = parts.port  # ValueError for a port not a number or past 65535
    except ValueError:
        port = -1
    if not parts.hostname or port == 0 or port == -1 or parts.netloc.endswith(":"):
        raise ValueError(f"{EXPECTED}, with a host and a port from 1 to 65535")
    path = parts.path.rstrip("/")
    if path.lower().endswith("/v1"):
        raise ValueError(f"{EXPECTED}, without the API's /v1, which the engine adds itself (here "
                         f"{url[:len(url) - len(parts.path)] + path[:-3]})")
    return url.rstrip("/")


def server_key(url: str) -> tuple[str, str, int, str]:
    """What makes two spellings of a URL the same server: the host's case, a default port and a trailing slash do
    not."""
    parts = urlsplit(url)
    return (parts.scheme.lower(), (parts.hostname or "").lower(), parts.port or DEFAULT_PORTS[parts.scheme.lower()],
            parts.path.rstrip("/"))


def distinct_servers(urls: list[str]) -> list[str]:
    """`urls`, checked to name every server once."""
    seen: dict[tuple, int] = {}
    for index, url in enumerate(urls):
        first = seen.setdefault(server_key(url), index)
        if first != index:
            raise ValueError(f"each server once (it would be given every weight push twice), but [{index}] {url} is "
                             f"the server of [{first}] {urls[first]}")
    return urls
