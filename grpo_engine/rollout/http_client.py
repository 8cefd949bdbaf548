"""JSON over HTTP to a rollout server, with the retry policy of the server backend.

A server that does not answer (refused or reset connection, a timeout, a 502 / 503 / 504 from a proxy or a
restarting server) is retried with exponential backoff until `retry_for_s` has passed since the first failure,
then `ServerUnavailable` names the URL and how long it was tried. Any other HTTP error is the request's fault and
is raised at once with the server's message. Every failed attempt is reported to `on_failure`: the caller then
knows the server may have restarted and lost the weights it was given.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Optional

RETRIED_STATUS = (502, 503, 504)
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.25, 10.0


class ServerUnavailable(ConnectionError):
    """A rollout server that did not answer for the configured time."""

    def __init__(self, url: str, waited_s: float, cause: str) -> None:
        self.url, self.waited_s = url, waited_s
        super().__init__(f"the rollout server {url} did not answer for {waited_s:.0f} s ({cause})")


class ServerRequestError(RuntimeError):
    """A request the server answered with an error of its own (4xx, 500): retrying would not help."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ServerClient:
    def __init__(self, base_url: str, retry_for_s: float, request_timeout_s: float,
                 on_failure: Optional[Callable[[], None]] = None) -> None:
        self.base_url, self.retry_for_s, self.request_timeout_s = base_url.rstrip("/"), retry_for_s, request_timeout_s
        self.on_failure = on_failure

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
                    raise ServerUnavailable(self.base_url, now - first_failure, str(exc)) from None
                time.sleep(min(backoff, max(0.0, first_failure + self.retry_for_s - now)))
                backoff = min(2 * backoff, MAX_BACKOFF_S)

    def is_up(self, timeout_s: float = 5.0) -> bool:
        """Whether GET /health answers 200 now (no retry)."""
        try:
            self._once("GET", "/health", None, timeout_s)
            return True
        except (_NoAnswer, ServerRequestError):
            return False

    def _once(self, method: str, path: str, payload: Optional[dict], timeout_s: float) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"} if data is not None else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            message = exc.read().decode(errors="replace")[:500]
            if exc.code in RETRIED_STATUS:
                raise _NoAnswer(f"HTTP {exc.code}") from None
            raise ServerRequestError(f"{method} {self.base_url}{path}: HTTP {exc.code}: {message}", exc.code) from None
        except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError) as exc:
            raise _NoAnswer(str(getattr(exc, "reason", exc))) from None
        if not body.strip():
            return None
        try:
            return json.loads(body)
        except ValueError:  # vLLM answers some calls (/v1/load_lora_adapter) with plain text
            return body.decode(errors="replace")


class _NoAnswer(Exception):
    pass
