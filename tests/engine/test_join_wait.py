"""The wait to join a launched run's processes is said: a WORLD_SIZE exported in a shell (no launcher, no other
process) waited in torch's rendezvous in silence for run.distributed_timeout_s (30 minutes by default)."""

from __future__ import annotations

import time

import pytest


@pytest.mark.parametrize("joins_after_s, said", [(0.6, True), (0.0, False)])
def test_a_wait_to_join_is_said_once(joins_after_s, said, monkeypatch, caplog):
    """A process that waits to join its launch says so once, naming where it waits and the setting (a WORLD_SIZE
    exported in a shell, with no launcher, waited in silence for the whole timeout); one that joins at once says
    nothing."""
    from grpo_engine import process_group

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    monkeypatch.setattr(process_group, "WAIT_NOTE_S", 0.2)
    monkeypatch.setattr(process_group, "Accelerator", lambda **kwargs: time.sleep(joins_after_s) or "joined")
    monkeypatch.setattr("grpo_engine.lost_process.record_processes", lambda: None)
    with caplog.at_level("WARNING", logger="grpo_engine"):
        assert process_group.join_processes(cpu=True, timeout_s=60.0) == "joined"
    time.sleep(0.3)  # a note due after the join would show by now
    notes = [record.getMessage() for record in caplog.records if "is waiting for the others" in record.getMessage()]
    assert len(notes) == int(said), notes
    if said:
        assert notes[0].startswith("note: process 1 of WORLD_SIZE=2 is waiting for the others at 127.0.0.1:29999")
        assert "for at most 60 s (run.distributed_timeout_s)" in notes[0] and "unset WORLD_SIZE" in notes[0]
