"""The lock file alone deleted while a run trains (a tidy-up, `rm` of a lock file thought stale), the directory
left where it is: the run makes it again, holds it, and trains on; a second run is still refused. Before, the run
stopped as if its directory had been deleted, moved or replaced, losing its steps since the last checkpoint."""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.state.run_lock import LOCK_FILE, RunDirectoryError, RunLock


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(st.sampled_from(["metrics.jsonl", "config.yaml", "checkpoints"]), unique=True),
       times=st.integers(1, 3), then=st.sampled_from(["nothing", "another run takes the name", "directory replaced"]))
def test_a_deleted_lock_file_is_held_again_unless_the_place_is_anothers(files, times, then, tmp_path, caplog):
    run_dir = Path(os.path.realpath(tmp_path)) / f"case-{uuid.uuid4().hex[:12]}" / "run"
    lock = RunLock.acquire(run_dir)
    other = None
    try:
        for name in files:
            (run_dir / name).mkdir() if name == "checkpoints" else (run_dir / name).write_text("kept\n")
        for _ in range(times):
            caplog.clear()
            (run_dir / LOCK_FILE).unlink()
            if then == "another run takes the name":  # its lock file, made before this run looks
                other = RunLock.acquire(run_dir)
            elif then == "directory replaced":
                run_dir.rename(run_dir.with_name("moved"))
                run_dir.mkdir()
            with caplog.at_level(logging.WARNING):
                held = lock.in_place()
            assert held == (then == "nothing")
            if not held:
                break
            assert [r.getMessage() for r in caplog.records] == [
                f"note: {run_dir / LOCK_FILE} was deleted while the run trained; made again, the run holds its "
                f"directory as before"]
            with pytest.raises(RunDirectoryError, match=f"process {os.getpid()} "):
                RunLock.acquire(run_dir)  # a second run is refused as before
        assert sorted(p.name for p in run_dir.iterdir() if p.name != LOCK_FILE) == \
            (sorted(files) if then != "directory replaced" else [])
    finally:
        lock.release()
        if other is not None:
            other.release()
