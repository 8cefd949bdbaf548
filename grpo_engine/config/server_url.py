"""rollout.server.urls: each a vLLM server's base URL the HTTP client can reach as written, and no server twice.

The client joins the base URL with the API's paths (`/health`, `/v1/completions`), so what the former pattern let
through failed later, naming something else: `http://host:8000/v1` (the OpenAI clients' base URL) asked for
`/v1/v1/models`; a query or fragment swallowed the paths; `http://user:pass@host` failed to resolve the host
`user`; a port past 65535 or not a number was a connection error after the model had loaded. A server listed twice
was given every weight push twice and, under NCCL, joined the transfer group twice, which then never formed.
The same holds for the whole family of each: any API path the engine adds itself (an endpoint's URL pasted from a
curl example, `.../v1/completions`, `.../health`), and any two spellings of one server's address (an IPv6 address
written out or compressed, a host name with the DNS root's trailing dot, an internationalised name in Unicode or in
its ASCII form). Nor may the machine itself be listed twice under two of its loopback names: `localhost`,
`127.0.0.1`, `[::1]`, `[::ffff:127.0.0.1]` and the wildcard `0.0.0.0` / `[::]` (which a client's connect reaches the
local host by) all reach a server on this machine that listens on them, named without any lookup (the loopback names
resolve from the system's hosts file, never by DNS), so one of them listed beside another is the same server.
Nor may a URL hold what the client cannot send as written: a control character (http.client refused it only at the
first request, which then counted as a server not answering), a path outside ASCII (a UnicodeEncodeError naming
nothing) or a % not starting an escape, an API path hidden by percent-encoding (`/v%31` is `/v1` to the server), or an
IPv6 zone id that names no network interface of this machine (`%25eth0`, RFC 6874's spelling, reached the
interface `25eth0`).
An address is read as the system's resolver reads it before any lookup: the older IPv4 forms (`127.1`,
`2130706433`, `0x7f000001`, `0177.0.0.1`), an IPv4 address inside an IPv6 one (`[::ffff:7f00:1]`), a zone
(`[::1%lo]`), and a name the hosts file gives an address (`localhost.localdomain`, `ip6-localhost`, the machine's
own name) are that address.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from functools import lru_cache
from pathlib import Path
from typing import Optional, Union
from urllib.parse import quote, unquote, urlsplit

EXPECTED = "expected a server's base URL, http://HOST:PORT"
DEFAULT_PORTS = {"http": 80, "https": 443}
# The top-level endpoints of vLLM's OpenAI server that the engine asks for or that a user may copy from its docs; a
# base URL ending in one (or holding a /v1 segment anywhere) is an endpoint's URL, to which the client adds its own.
_API_ENDPOINTS = {"v1", "health", "ping", "version", "metrics", "tokenize", "detokenize", "docs", "openapi.json",
                  "collective_rpc", "reset_prefix_cache", "get_world_size", "invocations", "pooling", "score",
                  "rerank", "classify"}


def server_url(url: str) -> str:
    """The URL without a trailing slash; ValueError in one clause for one the client would mistake."""
    if not re.fullmatch(r"https?://[^/\s]+(/[^\s]*)?", url):
        raise ValueError(EXPECTED)
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        raise ValueError(f"{EXPECTED}, without control characters")
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
    _check_path(parts.path)
    _check_zone(parts.hostname)
    segments = [segment for segment in parts.path.split("/") if segment]
    lowered = [unquote(segment).lower() for segment in segments]  # as the server reads them
    cut = lowered.index("v1") if "v1" in lowered else (
        len(segments) - 1 if segments and lowered[-1] in _API_ENDPOINTS else None)
    if cut is not None:
        api = "/".join(segments[cut:])
        base = url[:len(url) - len(parts.path)] + "".join("/" + segment for segment in segments[:cut])
        what = "the API's /v1" if unquote(api).lower() == "v1" else f"an API path (/{api})"
        raise ValueError(f"{EXPECTED}, without {what}, which the engine adds itself (here {base})")
    return url.rstrip("/")


def _check_path(path: str) -> None:
    """A path the client sends as written: ASCII, each % starting an escape %XX."""
    if not path.isascii():
        raise ValueError(f"{EXPECTED}, with a path in ASCII (percent-encoded: {quote(path, safe='/%')})")
    if re.search(r"%(?![0-9A-Fa-f]{2})", path):
        raise ValueError(f"{EXPECTED}, with % in the path only as an escape %XX (a % itself is %25)")


def _check_zone(host: str) -> None:
    """An IPv6 zone id (fe80::1%eth0) names a network interface of this machine, by name or index."""
    if "%" not in host:
        return
    zone = host.partition("%")[2]
    try:
        socket.if_nametoindex(zone)
    except OSError:
        if not (zone.isascii() and zone.isdigit()):
            names = ", ".join(name for _, name in socket.if_nameindex())
            encoded = " (written %25 in the URL, the % is to be written alone)" if zone.startswith("25") else ""
            raise ValueError(f"{EXPECTED}, with an IPv6 zone id naming a network interface of this machine ({names}), "
                             f"not {zone!r}{encoded}") from None


def server_key(url: str) -> tuple[str, str, int, str]:
    """What makes two spellings of a URL the same server: the host's case, a default port and a trailing slash do
    not, nor does the spelling of its address (server_host)."""
    parts = urlsplit(url)
    return (parts.scheme.lower(), server_host(parts.hostname or ""),
            parts.port or DEFAULT_PORTS[parts.scheme.lower()], parts.path.rstrip("/"))


# The spellings of "this machine" that a connect reaches a local server by, whatever the system's hosts file holds
# beyond them: vLLM listens on 0.0.0.0 (every address, IPv4) by default, which each of these reaches. Another
# 127.x address is left its own host: a server may bind 127.0.0.2 alone.
LOCAL_HOST = "localhost"
_LOCAL_ADDRESSES = {ipaddress.ip_address(a) for a in ("127.0.0.1", "::1", "0.0.0.0", "::", "::ffff:127.0.0.1")}


def server_host(host: str) -> str:
    """One spelling of `host` for each address it names without a lookup (host_address): an IP address in its
    compressed form (`0:0:0:0:0:0:0:1` is `::1`), a name without the DNS root's trailing dot, in lower case and in the
    ASCII form that DNS sends (IDNA: `bücher` is `xn--bcher-kva`); every loopback name of this machine is
    `localhost`."""
    try:
        # IDNA first: it maps a full-width dot (U+FF0E) to the ASCII one whose trailing copy is then cut
        name = host.lower().encode("idna").decode("ascii").rstrip(".")
    except UnicodeError:  # a name IDNA cannot encode (a label past 63 characters): the lookup fails on it anyway
        name = host.rstrip(".").lower()
    address = host_address(name)
    if address is None:
        return name
    return LOCAL_HOST if address in _LOCAL_ADDRESSES else address.compressed


Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
# The file the system's resolver reads names from before DNS (nsswitch's "files"); a test points it elsewhere.
HOSTS_FILE = Path("/etc/hosts")
# What C's inet_aton reads as an IPv4 address, and getaddrinfo with it: one to four numbers, decimal, 0x-hex or
# 0-octal. A name of letters (`deadbeef`, `1e100.net`) is not of this form.
_NUMERIC_IPV4 = re.compile(r"(?:0[xX][0-9a-fA-F]*|[0-9]+)(?:\.(?:0[xX][0-9a-fA-F]*|[0-9]+)){0,3}")


def host_address(host: str) -> Optional[Address]:
    """The address a URL's host part names before any DNS lookup, as the resolver reads it, or None: an IP address
    (an IPv4 one inside an IPv6 address is that IPv4 address; a zone is dropped), an older IPv4 form, or a name the
    hosts file lists."""
    try:
        address: Optional[Address] = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        address = _numeric_ipv4(host) or hosts_file_names(HOSTS_FILE).get(host.lower().rstrip("."))
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _numeric_ipv4(host: str) -> Optional[ipaddress.IPv4Address]:
    if not _NUMERIC_IPV4.fullmatch(host):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:  # a part past its range (256.1.1.1): no address, and the connection fails naming it
        return None


@lru_cache(maxsize=4)
def hosts_file_names(path: Path) -> dict[str, Address]:
    """Each name of the hosts file (lower case) -> the address of its first line, as the resolver takes it."""
    names: dict[str, Address] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:  # no hosts file (another platform, a sandbox): names are then told apart as written
        return names
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2:
            continue
        try:
            address = ipaddress.ip_address(fields[0].split("%")[0])
        except ValueError:
            continue
        for name in fields[1:]:
            names.setdefault(name.lower().rstrip("."), address)
    return names


def distinct_servers(urls: list[str]) -> list[str]:
    """`urls`, checked to name every server once."""
    seen: dict[tuple, int] = {}
    for index, url in enumerate(urls):
        first = seen.setdefault(server_key(url), index)
        if first != index:
            local = " (both name this machine)" if server_key(url)[1] == LOCAL_HOST else ""
            raise ValueError(f"each server once (it would be given every weight push twice), but [{index}] {url} is "
                             f"the server of [{first}] {urls[first]}{local}")
    return urls
