"""The run directory's manifest names what the engine wrote there; a manifest edited by hand or by a tool can name
anything. Whatever it names, a failed start removes nothing outside the run directory (it removed
`../victim.txt` when given its fingerprint) and nothing but the names the engine gives its own files."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.state.run_files import MANIFEST, fingerprint, remove_own_start

TRAVERSALS = ["../victim.txt", "..", ".", "", "./victim.txt", "sub/../../victim.txt", "..\\victim.txt",
              "/abs/victim.txt", "~/victim.txt", "sub/file.txt", ".grpo-engine.lock", "checkpoints"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(st.one_of(st.sampled_from(TRAVERSALS), st.text(min_size=1, max_size=12)), max_size=6))
def test_a_failed_start_removes_only_top_level_files_the_engine_names(names, tmp_path_factory):
    root = tmp_path_factory.mktemp("manifest")
    run = root / "run"
    (run / "sub").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    outside = root / "victim.txt"
    outside.write_text("a user's file")
    (run / "sub" / "file.txt").write_text("a user's file")
    (run / ".grpo-engine.lock").write_text("")
    abs_target = Path("/abs/victim.txt")
    entries = {}
    for name in names:
        target = (run / name) if not name.startswith("/") else abs_target
        try:
            entries[name] = fingerprint(target) if target.exists() else "0" * 64
        except OSError:
            entries[name] = "0" * 64
    entries["../victim.txt"] = fingerprint(outside)
    (run / MANIFEST).write_text(json.dumps(entries))
    removed = remove_own_start(run, present_before=set())
    assert outside.read_text() == "a user's file"
    assert (run / "sub" / "file.txt").exists() and (run / ".grpo-engine.lock").exists()
    assert all("/" not in name and "\\" not in name and name not in ("", ".", "..") for name in removed), removed
