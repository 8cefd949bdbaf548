"""How a request reaches a rollout server: which proxy it goes through, and what a redirect or a TLS failure is.

urllib, left to itself, sends a request through the environment's `http_proxy` / `https_proxy` unless `no_proxy`
lists the host as written, so a cluster's proxy variables sent requests for `127.0.0.1` to a proxy (which cannot
reach this machine's loopback: its error, or another service's answer, came back as the server's), and a failure
through a proxy named only the server. It follows redirects, to any host, turning a redirected POST into a GET
without its body. Here: this machine's own addresses never go through a proxy, the proxy another host's requests
go through is known before the first request (and named in every failure), and a redirect is not followed but
said, with where it points.
"""

from __future__ import annotations

import ssl
import urllib.request
from typing import Optional
from urllib.parse import urlsplit

from ..config.server_url import LOCAL_HOST, host_address, server_host


def is_this_machine(host: str) -> bool:
    """A loopback address (any 127.x in any IPv4 form, ::1) or one of the names server_url takes for this machine."""
    address = host_address(host)
    return server_host(host) == LOCAL_HOST or (address is not None and address.is_loopback)


def proxy_for(url: str) -> Optional[str]:
    """The proxy the environment sends requests for `url` through (None: direct), as urllib would choose it, except
    that this machine is always reached directly."""
    parts = urlsplit(url)
    if is_this_machine(parts.hostname or ""):
        return None
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.netloc):
        return None
    return proxy


def shown_proxy(proxy: str) -> str:
    """The proxy's URL without its user:password@ (a message must not print a password)."""
    scheme, _, rest = proxy.rpartition("://")
    return (f"{scheme}://" if scheme else "") + rest.rpartition("@")[2]


def proxy_handler(proxy: Optional[str], scheme: str) -> urllib.request.ProxyHandler:
    """The one proxy chosen (or none): not urllib's own reading of the environment, which would choose again."""
    return urllib.request.ProxyHandler({scheme: proxy} if proxy else {})


class RefusedRedirect(urllib.request.HTTPRedirectHandler):
    """Every 3xx stays an HTTPError for the client to name: a rollout server's API never redirects, and one that
    does (a load balancer, http -> https) would have its POST bodies dropped on the way or reach another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        return None


def redirect_message(code: int, location: Optional[str]) -> str:
    where = f"to {location}" if location else "without a Location"
    return (f"HTTP {code} redirecting {where}: the engine follows no redirect (a POST would lose its body); set "
            f"rollout.server.urls to the server's own base URL")


# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH: a trusted certificate of another host.
_NAME_MISMATCH = (62, 64)


def tls_problem(exc: BaseException) -> Optional[str]:
    """What a TLS failure says to do, or None for an error that is not one: retrying would not change it."""
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, ssl.SSLCertVerificationError) and reason.verify_code in _NAME_MISMATCH:
        return (f"its TLS certificate is issued for another name ({reason.verify_message}): write the URL with a host "
                f"name the certificate names")
    if isinstance(reason, ssl.SSLCertVerificationError):
        return (f"its TLS certificate is not trusted here ({reason.verify_message}): point SSL_CERT_FILE at the "
                f"CA bundle that signed it")
    if isinstance(reason, ssl.SSLError):
        return (f"the TLS handshake failed ({reason.reason or reason}): is it a plain-HTTP server? then write "
                f"http://")
    return None
