"""JSON over HTTP to a rollout server, with the retry policy of the server backend.

A server that does not answer (refused or reset connection, a timeout, a 502 / 503 / 504 from a proxy or a
restarting server) is retried with exponential backoff until `retry_for_s` has passed since the first failure,
then `ServerUnavailable` names the URL and how long it was tried. Any other HTTP error is the request's fault and
is raised at once with the server's message. Every failed attempt is reported to `on_failure`: the caller then
knows the server may have restarted and lost the weights it was given.

Every request is bounded as a whole, not per socket read: a server that accepts and never answers, sends its answer
a byte at a time (each read within the socket's timeout), or sends a body that never ends is cut off when
`request_timeout_s` has passed since the request began (a timer shuts the connection's socket down) or when its
body passes MAX_ANSWER_BYTES, and bytes that are not HTTP count as no answer. An answer that is JSON of another
shape than the request expects is one line naming the URL and the field (`read_field`), not a TypeError inside
the backend; the body itself is read strictly in one place (answer_body.py). What never changes by retrying is said
at once: a redirect (never followed) and a TLS failure (http_route.py); a 429 or 408 (a gateway's throttle, a
server's own timeout) is retried as no answer. A request through a proxy names it in every failure.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Optional, Union
from urllib.parse import urlsplit

from .answer_body import AnswerProblem, decoded
from .http_route import RefusedRedirect, proxy_for, proxy_handler, redirect_message, shown_proxy, tls_problem

RETRIED_STATUS = (408, 429, 502, 503, 504)
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.25, 10.0
# Far above any answer of the API the engine uses (one completion's token ids and log-probs: about 100 bytes a token).
MAX_ANSWER_BYTES = 256 * 2**20
READ_CHUNK_BYTES = 2**16


class ServerUnavailable(ConnectionError):
    """A rollout server that did not answer for the configured time."""

    def __init__(self, url: str, waited_s: float, cause: str) -> None:
        self.url, self.waited_s = url, waited_s
        super().__init__(f"the rollout server {url} did not answer for {waited_s:.0f} s ({cause})")


class ServerUnreachable(ServerUnavailable):
    """A server the client cannot speak to as its URL says (a TLS failure): retrying would not change it, and mid-run
    it stops the run with a checkpoint as a server that does not answer does."""

    def __init__(self, url: str, problem: str) -> None:
        self.url, self.waited_s, self.problem = url, 0.0, problem
        ConnectionError.__init__(self, f"the rollout server {url} cannot be reached: {problem}")


class ServerRequestError(RuntimeError):
    """A request the server answered with an error of its own (4xx, 500): retrying would not help."""

    def __init__(self, message: str, status: int, detail: str = "") -> None:
        super().__init__(message)
        self.status, self.detail = status, detail or message  # detail: the message less the request


class ServerAnswerError(ValueError):
    """An answer of another shape than the request expects (not JSON, a field missing): not a vLLM server's."""


class ServerClient:
    def __init__(self, base_url: str, retry_for_s: float, request_timeout_s: float,
                 on_failure: Optional[Callable[[], None]] = None) -> None:
        self.base_url, self.retry_for_s, self.request_timeout_s = base_url.rstrip("/"), retry_for_s, request_timeout_s
        self.on_failure = on_failure
        self.proxy = proxy_for(self.base_url)  # chosen once: every failure through it names it

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, payload: Optional[dict] = None) -> Any:
        return self.request("POST", path, payload)

    def request(self, method: str, path: str, payload: Optional[dict] = None) -> Any:
        """The decoded JSON answer (the text of one that is not JSON, None for an empty body), retried while the server does not answer."""
        first_failure, backoff = None, FIRST_BACKOFF_S
        while True:
            try:
                return self._once(method, path, payload, self.request_timeout_s)
            except _NoAnswer as exc:
                if self.on_failure is not None:
                    self.on_failure()
                now = time.monotonic()
                first_failure = first_failure or now
                if now - first_failure >= self.retry_for_s:
                    raise ServerUnavailable(self.base_url, now - first_failure, self._through(str(exc))) from None
                time.sleep(min(backoff, max(0.0, first_failure + self.retry_for_s - now)))
                backoff = min(2 * backoff, MAX_BACKOFF_S)

    def is_up(self, timeout_s: float = 5.0) -> bool:
        """Whether GET /health answers 200 now (no retry)."""
        return self.down_reason(timeout_s) is None

    def down_reason(self, timeout_s: float = 5.0) -> Optional[str]:
        """Why GET /health does not answer 200 now (no retry), in a clause; None when it does."""
        try:
            self._once("GET", "/health", None, timeout_s)
            return None
        except _NoAnswer as exc:
            return self._through(str(exc))
        except ServerUnreachable as exc:
            return exc.problem
        except ServerRequestError as exc:
            return exc.detail
        except ServerAnswerError as exc:
            return str(exc)

    def read_field(self, answer: Any, request: str, *keys: Union[str, int], kind: type = object) -> Any:
        """answer[keys[0]][keys[1]]..., of type `kind`; ServerAnswerError in one line naming the URL, `request`
        ("GET /v1/models") and the first key the answer lacks, or the field of another type."""
        value = answer
        for depth, key in enumerate(keys):
            holder = dict if isinstance(key, str) else list
            if not isinstance(value, holder) or (key not in value if holder is dict else not 0 <= key < len(value)):
                raise self.answer_error(request, keys[:depth + 1], "without", value)
            value = value[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.answer_error(request, keys, f"with a {type(value).__name__} for a {kind.__name__} at", value)
        return value

    def answer_error(self, request: str, keys: tuple, how: str, value: Any,
                     hint: str = "is it a vLLM server?") -> ServerAnswerError:
        """One line: this server answered `request` `how` the field at `keys` (its value shown, shortened)."""
        where = "".join(f"[{k!r}]" for k in keys)
        return ServerAnswerError(f"the rollout server {self.base_url} answered {request} {how} {where} "
                                 f"(got {_shown(value)}): {hint}")

    def _through(self, cause: str) -> str:
        return cause if self.proxy is None else (
            f"{cause}; through the proxy {shown_proxy(self.proxy)} of the environment's "
            f"{urlsplit(self.base_url).scheme}_proxy: list the host in NO_PROXY to reach it directly")

    def _once(self, method: str, path: str, payload: Optional[dict], timeout_s: float) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data is not None else {})
        deadline = _Deadline(timeout_s)
        try:
            with self._opener(deadline).open(request, timeout=timeout_s) as response:
                body = _bounded_body(response, f"{method} {self.base_url}{path}")
                encoding = response.headers.get("Content-Encoding", "")
        except urllib.error.HTTPError as exc:
            message = _bounded_body(exc, f"{method} {self.base_url}{path}").decode(errors="replace")[:500]
            if exc.code in RETRIED_STATUS:
                raise _NoAnswer(f"HTTP {exc.code}") from None
            detail = (redirect_message(exc.code, exc.headers.get("Location")) if 300 <= exc.code < 400  # not followed
                      else f"HTTP {exc.code}: {message}")
            raise ServerRequestError(f"{method} {self.base_url}{path}: {detail}", exc.code, detail) from None
        except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError, http.client.HTTPException,
                OSError) as exc:
            if deadline.expired:
                raise _NoAnswer(f"no whole answer within {timeout_s:g} s") from None
            problem = tls_problem(exc)
            if problem is not None:
                raise ServerUnreachable(self.base_url, self._through(problem)) from None
            if isinstance(exc, http.client.HTTPException) and not isinstance(exc, ConnectionError):
                raise _NoAnswer(f"not an HTTP answer: {type(exc).__name__} {_shown(str(exc))}") from None
            raise _NoAnswer(str(getattr(exc, "reason", exc))) from None
        finally:
            deadline.cancel()
        if deadline.expired:  # the timer fired as the last bytes came: the body may be cut short
            raise _NoAnswer(f"no whole answer within {timeout_s:g} s")
        try:
            return decoded(body, encoding, MAX_ANSWER_BYTES)
        except AnswerProblem as exc:
            raise ServerAnswerError(f"the rollout server {self.base_url} answered {method} {path} {exc}: is it a "
                                    f"vLLM server?") from None

    def _opener(self, deadline: "_Deadline") -> urllib.request.OpenerDirector:
        """urllib's opener with the one proxy chosen (or none), no redirect followed, its connections watched by
        `deadline`."""
        return urllib.request.build_opener(proxy_handler(self.proxy, urlsplit(self.base_url).scheme),
                                           RefusedRedirect(), _WatchedHTTPHandler(deadline),
                                           _WatchedHTTPSHandler(deadline))


class _NoAnswer(Exception):
    pass


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _bounded_body(response: Any, request: str) -> bytes:
    """The body, read in chunks: one past MAX_ANSWER_BYTES is refused (a body that never ends would fill memory),
    and one shorter than its Content-Length is no answer (http.client's chunked read says nothing of it)."""
    chunks, size = [], 0
    while True:
        chunk = response.read(READ_CHUNK_BYTES)
        if not chunk:
            missing = getattr(response, "length", None)
            if missing:
                raise http.client.IncompleteRead(b"".join(chunks), missing)
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise ServerAnswerError(f"{request}: the answer passed {MAX_ANSWER_BYTES} bytes: is it a vLLM server?")
        chunks.append(chunk)


class _Deadline:
    """Shuts down the sockets of one request when `seconds` have passed since it began: a socket timeout bounds
    each read, and a server that sends a byte now and then would otherwise hold the request for ever."""

    def __init__(self, seconds: float) -> None:
        self.expired, self._sockets, self._lock = False, [], threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shut(sock)

    def cancel(self) -> None:
        self._timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # a blocked recv() returns at once; close() alone would not wake it
    except OSError:
        pass


def _watched(connection_class: type, deadline: _Deadline) -> type:
    class WatchedConnection(connection_class):
        def connect(self) -> None:
            super().connect()
            deadline.watch(self.sock)
    return WatchedConnection


class _WatchedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req):
        return self.do_open(_watched(http.client.HTTPConnection, self.deadline), req)


class _WatchedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def https_open(self, req):
        return self.do_open(_watched(http.client.HTTPSConnection, self.deadline), req,
                            context=self._context)
