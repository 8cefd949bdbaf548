"""The GPU command's results directory: an append-only progress log that survives kill -9, and the
pytest-benchmark-shaped JSON and markdown report regenerated from it.

A directory holds, and only holds (a lent GPU machine brings back 8 files from its out folder):

    progress.jsonl     one JSON event per line, appended whole and fsynced: the source of truth
    pytest-gpu.log     the GPU tests' output
    <name>.json        what `python -m benchmarks.suite.report` reads (pytest-benchmark's layout), rewritten atomically
    <name>.md          the report made from it, rewritten atomically

Events: {"event": "part", "part", "command", "meta"} when an invocation starts; {"event": "started", "id"}
before an item (a GPU check or a benchmark case) runs; then one terminal event for it: "result" (with the
pytest-benchmark record), "check" (a GPU check's outcome), "skipped" or "failed" (with the reason). An item
that was started and has no terminal event was in flight when its process died.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Sequence

from grpo_engine.state.atomic_file import write_atomically

from ..suite import report

PROGRESS_FILE = "progress.jsonl"
TESTS_LOG_FILE = "pytest-gpu.log"
TERMINAL_EVENTS = ("result", "check", "skipped", "failed")
FAILED = "FAILED"  # in a skip reason: the case raised or killed its process (not a skip): the command exits 1


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclass
class Progress:
    parts: list[dict] = field(default_factory=list)  # the "part" events, in order
    finished: dict[str, dict] = field(default_factory=dict)  # item id -> its terminal event (the last one)
    starts: Counter = field(default_factory=Counter)  # item id -> "started" events, for unfinished items

    def results(self) -> list[dict]:
        return [event["record"] for event in self.finished.values() if event["event"] == "result"]

    def checks(self) -> list[dict]:
        return [event["outcome"] for event in self.finished.values() if event["event"] == "check"]

    def failures(self) -> list[str]:
        """One line per failed item and per GPU check that did not pass."""
        lines = [f"{event['id']}: {event['reason']}" for event in self.finished.values() if event["event"] == "failed"]
        lines += [f"{check['command']}: {check['summary']} (exit code {check['exit_code']})"
                  for check in self.checks() if check["exit_code"] != 0]
        return lines


class ResultsDir:
    """One run's directory (`--out`), continued by every invocation that names it."""

    def __init__(self, out_dir: str, name: str):
        self.out_dir = out_dir
        self.name = name
        self.progress_path = os.path.join(out_dir, PROGRESS_FILE)
        self.tests_log_path = os.path.join(out_dir, TESTS_LOG_FILE)
        self.json_path = os.path.join(out_dir, name + ".json")
        self.md_path = os.path.join(out_dir, name + ".md")

    def open(self, resume_from: Optional[str] = None) -> str:
        """Create the directory; start it from a copy of an earlier run's directory when it has no progress yet.

        Returns what it continues: a missing or empty `resume_from` is a new run (the first part of a run
        carries an empty folder, which may not travel), said in the returned line."""
        os.makedirs(self.out_dir, exist_ok=True)
        for entry in os.listdir(self.out_dir):
            if entry.endswith(".tmp"):  # a rewrite that a kill interrupted
                os.remove(os.path.join(self.out_dir, entry))
        if os.path.exists(self.progress_path):
            return f"continuing the run in {self.out_dir}"
        if not resume_from or not os.path.exists(os.path.join(resume_from, PROGRESS_FILE)):
            return f"a new run in {self.out_dir}" + (f" ({resume_from} holds no {PROGRESS_FILE})" if resume_from else "")
        for entry in (PROGRESS_FILE, TESTS_LOG_FILE):
            source = os.path.join(resume_from, entry)
            if os.path.exists(source):
                shutil.copyfile(source, os.path.join(self.out_dir, entry))
        return f"continuing the run of {resume_from} in {self.out_dir}"

    def append(self, event: dict) -> None:
        """One whole line, written in one call and fsynced: a kill leaves at most a torn last line."""
        line = json.dumps({**event, "time": now()}, separators=(",", ":")) + "\n"
        fd = os.open(self.progress_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size and not _ends_with_newline(self.progress_path):
                line = "\n" + line  # end the torn line first, so that this one parses
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def events(self) -> list[dict]:
        """Every event that parses; a torn line (killed mid-write) is left out."""
        if not os.path.exists(self.progress_path):
            return []
        events = []
        with open(self.progress_path) as f:
            for line in f:
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(event, dict) and "event" in event:
                    events.append(event)
        return events

    def progress(self) -> Progress:
        state = Progress()
        for event in self.events():
            kind = event["event"]
            if kind == "part":
                state.parts.append(event)
            elif kind == "started":
                state.starts[event["id"]] += 1
            elif kind in TERMINAL_EVENTS:
                state.finished[event["id"]] = event
        for item in state.finished:
            state.starts.pop(item, None)
        return state

    def write_report(self, planned: Sequence[str] = ()) -> None:
        """The pytest-benchmark JSON and its markdown report, from what the progress log holds now; the
        `planned` items (ids) without a result yet are listed among the skipped, as not reached yet."""
        state = self.progress()
        data = results_json(state)
        data["skipped"] += [{"nodeid": f"gpu::{item}", "reason": f"{label(item)}: not run yet (the same GPU command "
                             f"continues the run)"}
                            for item in planned if item not in state.finished]
        write_atomically(self.json_path, json.dumps(data, indent=1))
        write_atomically(self.md_path, report.full_report(report.load_run(self.json_path)))


def results_json(state: Progress) -> dict:
    """pytest-benchmark's layout: the measured cases, the skipped and failed ones with their reasons, and the
    run's metadata (the last part's device and versions, every part's command, the GPU tests' outcome)."""
    last = state.parts[-1]["meta"] if state.parts else {}
    commands = [event["command"] for event in state.parts]
    checks = state.checks()
    meta = {**last, "command_line": " ; ".join(dict.fromkeys(commands)) or None,
            "parts": [{"part": event["part"], "command": event["command"], "time": event["time"],
                       "commit": event["meta"].get("commit"), "source_digest": event["meta"].get("source_digest")}
                      for event in state.parts],
            "gpu_tests": checks[0] if checks else None, "gpu_checks": checks}
    skipped = [{"nodeid": f"gpu::{item}", "reason": event["reason"]}
               for item, event in state.finished.items() if event["event"] in ("skipped", "failed")]
    return {"machine_info": {"grpo_bench": meta}, "commit_info": {"id": last.get("commit")},
            "datetime": state.parts[0]["time"] if state.parts else now(), "benchmarks": state.results(),
            "skipped": skipped}


def label(item: str) -> str:
    """What a skip reason starts with: a case's path (its id ends with it), or the check's name."""
    return item.removeprefix("check::") if item.startswith("check::") else item.rsplit("-", 1)[-1]


def _ends_with_newline(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"

