"""What torch's rendezvous prints while a launched process joins the others, reduced to what a person can act on.

torch's TCPStore client logs every failed try to reach MASTER_ADDR:MASTER_PORT from C++ (a `[W... TCPStore.cpp]`
line, then "Exception raised from ..." and a C++ stack of ~15 frames): a process started a few seconds before rank 0
printed about 40 lines, and one whose MASTER_PORT another program held (a vLLM server, a web server) printed 124 lines
for a 15 s timeout, none of them saying that the program answering there is not torch's store. During the join,
descriptor 2 goes through a pipe whose reader drops those blocks and says, once, the one thing they knew that the
join's own messages do not: something else answers on that port (with the first bytes it sent). Whatever else is
written to stderr meanwhile passes through unchanged. The join's failure is said by grpo_engine/process_group.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from typing import Callable, Iterator

# A c10d log line (glog's prefix: severity, date, time, thread, file:line) and the lines torch adds below it.
_C10D_LINE = re.compile(r"^\[[WEI]\d{4} [\d:.]+ (\d+ )?[\w.]+:\d+\] \[c10d\]")
_BLOCK_TAIL = re.compile(r"^(Exception raised from |frame #\d+: |<omitting python frames>|\s*$)")
# The store's ping carries a number the server must send back; another program's answer shows in its place.
_FOREIGN_ANSWER = re.compile(r"Ping failed, invalid value returned from server\. Expected: \d+, Got: (\d+)")


def foreign_answer_note(line: str, address: str) -> str | None:
    """The note for a c10d line saying the program at `address` answered the store's ping with something else
    (None for any other line): the 4 bytes it sent, as the text they spell where they are printable."""
    found = _FOREIGN_ANSWER.search(line)
    if found is None:
        return None
    got = int(found.group(1)).to_bytes(8, "little").rstrip(b"\0")[:4]
    text = got.decode("latin-1")
    shown = repr(text) if text.isprintable() and text else f"the number {found.group(1)}"
    return (f"note: a program that is not torch's rendezvous store answers at {address} (it sent {shown} where the "
            f"store sends a number back): another program holds MASTER_PORT on rank 0's host, so the processes "
            f"cannot meet there; give the launch a free MASTER_PORT")


class _StoreLogFilter:
    """Reads what is written to descriptor 2 and writes it to `out`, less c10d's log blocks; calls `on_c10d` with
    each dropped c10d line."""

    def __init__(self, read_fd: int, out_fd: int, on_c10d: Callable[[str], None]) -> None:
        self._read_fd, self._out_fd, self._on_c10d = read_fd, out_fd, on_c10d
        self._in_block = False

    def run(self) -> None:
        with open(self._read_fd, "rb", closefd=True) as pipe:
            for raw in pipe:
                line = raw.decode("utf-8", "replace")
                if _C10D_LINE.match(line):
                    self._in_block = True
                    self._on_c10d(line)
                elif not (self._in_block and _BLOCK_TAIL.match(line)):
                    self._in_block = False
                    self._write(raw)

    def _write(self, data: bytes) -> None:
        try:
            os.write(self._out_fd, data)
        except OSError:  # stderr gone: nothing to tell it
            pass


@contextlib.contextmanager
def quiet_store_retries(address: str) -> Iterator[None]:
    """Within the block, c10d's retry logs on descriptor 2 are dropped; a foreign program answering at `address`
    (MASTER_ADDR:MASTER_PORT) is said once. Descriptor 2 is restored on the way out, everything written to it
    meanwhile passed on first."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no descriptor 2 to redirect: leave the output as it is
        yield
        return
    said: list[str] = []

    def on_c10d(line: str) -> None:
        note = foreign_answer_note(line, address)
        if note is not None and not said:
            said.append(note)
            with contextlib.suppress(OSError):
                os.write(saved, (note + "\n").encode())

    read_fd, write_fd = os.pipe()
    reader = threading.Thread(target=_StoreLogFilter(read_fd, saved, on_c10d).run, name="rendezvous-log",
                              daemon=True)
    reader.start()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer closed: the reader sees its end once it has passed everything on
        reader.join(timeout=5.0)
        if not reader.is_alive():  # else a child holding the pipe keeps the reader, which still writes to `saved`
            os.close(saved)
