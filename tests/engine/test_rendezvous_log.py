"""torch's rendezvous logs while a process joins (grpo_engine/rendezvous_log.py): c10d's retry blocks dropped from
descriptor 2, every other line passed on in order, and another program answering the store's ping said once."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given, settings, strategies as st

from grpo_engine.rendezvous_log import foreign_answer_note
from processes import subprocess_env

BLOCK = ["[W1129 20:56:44.668630264 TCPStore.cpp:340] [c10d] TCP client failed to connect/validate to host "
         "127.0.0.1:{port} - retrying (try=0, timeout=15000ms, delay=395ms): Ping failed, invalid value returned "
         "from server. Expected: 26469, Got: {got}",
         "Exception raised from ping at /pytorch/torch/csrc/distributed/c10d/TCPStore.cpp:427 (most recent call "
         "first):",
         "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9d (0x7f449698db8d in libc10.so)",
         "<omitting python frames>",
         "frame #58: _start + 0x21 (0x55e540881081 in python3)",
         ""]
OTHER = st.text(st.characters(codec="utf-8", exclude_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
                min_size=1, max_size=40).filter(lambda line: line.strip() and not line.startswith(("[", "frame #")))


def test_the_answer_another_program_gave_is_shown_as_its_bytes():
    http = int.from_bytes(b"HTTP", "little")
    note = foreign_answer_note(BLOCK[0].format(port=1, got=http), "10.0.0.1:29500")
    assert note is not None and "'HTTP'" in note and "10.0.0.1:29500" in note and "MASTER_PORT" in note
    assert "the number 7" in foreign_answer_note(BLOCK[0].format(port=1, got=7), "h:1")
    assert foreign_answer_note("[W1129 1:2:3.4 socket.cpp:1] [c10d] The client socket has timed out", "h:1") is None


@settings(max_examples=10, deadline=None)
@given(before=st.lists(OTHER, max_size=3), between=st.lists(OTHER, max_size=3), blocks=st.integers(1, 4))
def test_retry_blocks_are_dropped_and_every_other_line_passes_in_order(before, between, blocks):
    http = int.from_bytes(b"HTTP", "little")
    block = [line.format(port=29500, got=http) for line in BLOCK]
    text = "\n".join([*before, *(block * blocks), *between, *block]) + "\nlast\n"
    script = ("import os, sys\n"
              "from grpo_engine.rendezvous_log import quiet_store_retries\n"
              "with quiet_store_retries('127.0.0.1:29500'):\n"
              "    os.write(2, sys.stdin.buffer.read())\n"
              "os.write(2, b'after\\n')\n")
    result = subprocess.run([sys.executable, "-c", script], input=text.encode(), capture_output=True,
                            env=subprocess_env(), timeout=60)
    lines = result.stderr.decode().splitlines()
    note = [line for line in lines if line.startswith("note: a program that is not torch's rendezvous store")]
    assert result.returncode == 0 and len(note) == 1 and "'HTTP'" in note[0], lines
    assert [line for line in lines if line not in note] == [*before, *between, "last", "after"], lines
