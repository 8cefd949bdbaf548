"""A local TCP server that accepts HTTP connections and then misbehaves in one chosen way, for the tests of the
rollout server client's bounds: it never answers, answers bytes that are not HTTP, sends its answer one byte at a
time, sends an endless body, cuts its body short, or answers 200 with a body that is not what was asked for;
`routed` answers by method and path. Each connection is served in its own daemon thread; `close()` stops accepting
and drops every connection."""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable

Behaviour = Callable[[socket.socket, threading.Event], None]


def _read_request(conn: socket.socket) -> bytes:
    """The request's head (what came before the blank line; less if the client stopped)."""
    conn.settimeout(5.0)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def silent(conn: socket.socket, stop: threading.Event) -> None:
    _read_request(conn)
    stop.wait()


def raw_bytes(payload: bytes) -> Behaviour:
    def behaviour(conn: socket.socket, stop: threading.Event) -> None:
        _read_request(conn)
        conn.sendall(payload)
    return behaviour


def response(status: int, body: bytes = b"", content_type: str = "application/json", headers: str = "") -> bytes:
    """A whole HTTP answer; `headers` more header lines, each ending in \\r\\n."""
    return (f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n{headers}"
            f"Connection: close\r\n\r\n").encode() + body


def answer(status: int, body: bytes, content_type: str = "application/json") -> Behaviour:
    return raw_bytes(response(status, body, content_type))


def routed(answers: Callable[[str, str], bytes]) -> Behaviour:
    """Each request answered with `answers(method, path)` (raw bytes); `behaviour.asked` lists what was asked."""
    def behaviour(conn: socket.socket, stop: threading.Event) -> None:
        head = _read_request(conn)
        if not head:
            return
        method, path = head.split(b"\r\n")[0].decode().split()[:2]
        behaviour.asked.append((method, path))
        conn.sendall(answers(method, path))
    behaviour.asked = []
    return behaviour


def trickle(payload: bytes, every_s: float) -> Behaviour:
    """`payload` one byte at a time, each well within a socket timeout of more than `every_s`."""
    def behaviour(conn: socket.socket, stop: threading.Event) -> None:
        _read_request(conn)
        for i in range(len(payload)):
            if stop.wait(every_s):
                return
            conn.sendall(payload[i:i + 1])
    return behaviour


def endless_body(conn: socket.socket, stop: threading.Event) -> None:
    """A chunked 200 whose chunks never end."""
    _read_request(conn)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"[" * 65536
    while not stop.is_set():
        conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))


def cut_body(conn: socket.socket, stop: threading.Event) -> None:
    _read_request(conn)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"data\": [")


class MisbehavingServer:
    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour, self.stop = behaviour, threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self.behaviour(conn, self.stop)
        except OSError:
            pass
        finally:
            time.sleep(0.01)
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        for conn in self.connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> "MisbehavingServer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
