"""A results file of the benchmark suite (the pytest-benchmark JSON that `pytest benchmarks/suite/` writes) as the
report reads it, checked field by field when it is read: anything else is one line naming the file and the field.

`python -m benchmarks.suite.report` read the file with json.load and indexed it as it went: a missing file, a
directory, a truncated file, `"benchmarks": "x"` or a case whose "hidden" is text ended in a traceback from json or
from the report's arithmetic, and a file with no case of this suite printed an empty report.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from grpo_engine.state.bounded_read import FileBoundError, read_bounded_bytes

from .cases import LOSS_CASES, OPERATIONS, REGIMES
from .paths import PATHS, ROUTED
from .shapes import DTYPES

MAX_RESULTS_BYTES = 256 << 20  # a full GPU run is a few MB

# What each case of this suite records in extra_info (tests/suite: bench_* fixtures), by type.
CASE_TEXT = ("path", "operation", "config", "regime", "head", "dtype")
# Text the report and the calibration look up in a fixed list: a value outside it has no place in the tables. Only
# the regime was checked before; a path or operation outside its list silently dropped the case's row (the
# reference's, taking every speedup with it), a config outside it became a section of its own, and a dtype outside
# it failed in the calibration's cost model. "-" is the config of the cases that have none (log-probs, the floor).
CASE_CHOICES = {"regime": REGIMES, "path": (*ROUTED, *PATHS, "floor"), "operation": OPERATIONS,
                "config": ("-", *LOSS_CASES), "dtype": tuple(DTYPES)}
CASE_COUNTS = ("hidden", "vocab", "tokens")
OPTIONAL_COUNTS = ("flops", "peak_extra_bytes")
OPTIONAL_NUMBERS = ("mean_entropy", "cuda_event_median_ms")


class ResultsFileError(ValueError):
    """A results file the report cannot read: one line naming the file and what is wrong."""


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _case_problem(bench: Any) -> str | None:
    """What is wrong with one entry of "benchmarks" that is a case of this suite, or None (also for an entry of
    another suite, which the report leaves out)."""
    if not isinstance(bench, dict):
        return f"is {type(bench).__name__}, not an object"
    info = bench.get("extra_info", {})
    if not isinstance(info, dict):
        return "has an extra_info that is not an object"
    if "path" not in info:
        return None
    for name in CASE_TEXT:
        if not isinstance(info.get(name), str):
            return f"extra_info.{name} is {info.get(name)!r:.40}, not text"
    for name, choices in CASE_CHOICES.items():
        if info[name] not in choices:
            return f"extra_info.{name} is {info[name]!r:.40}, not one of {', '.join(choices)}"
    for name in CASE_COUNTS:
        if not (_is_count(info.get(name)) and info[name] > 0):
            return f"extra_info.{name} is {info.get(name)!r:.40}, not a count > 0"
    for name in OPTIONAL_COUNTS:
        if info.get(name) is not None and not _is_count(info[name]):
            return f"extra_info.{name} is {info[name]!r:.40}, not a count >= 0"
    for name in OPTIONAL_NUMBERS:
        if info.get(name) is not None and not _is_number(info[name]):
            return f"extra_info.{name} is {info[name]!r:.40}, not a finite number"
    if not info.get("cuda_event_median_ms"):
        stats = bench.get("stats")
        median = stats.get("median") if isinstance(stats, dict) else None
        if not (_is_number(median) and median > 0):
            return f"stats.median is {median!r:.40}, not a time > 0 (and extra_info has no cuda_event_median_ms)"
    return None


def read_results(path: str) -> dict:
    """The results file at `path`, every case of this suite in it of the fields the report reads;
    ResultsFileError in one line otherwise."""
    file = Path(path)
    if not file.exists():
        raise ResultsFileError(f"results file {path!r} does not exist")
    if file.is_dir():
        raise ResultsFileError(f"results file {path!r} is a directory; name a JSON file `pytest benchmarks/suite/` "
                               f"wrote")
    try:
        data = json.loads(read_bounded_bytes(file, MAX_RESULTS_BYTES, "a results file").decode("utf-8"))
    except (FileBoundError, OSError) as exc:
        raise ResultsFileError(f"results file {path!r}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ResultsFileError(f"results file {path!r} is not UTF-8 text (byte {exc.start})") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        where = f" (line {exc.lineno} column {exc.colno}: {exc.msg})" if isinstance(exc, json.JSONDecodeError) else ""
        raise ResultsFileError(f"results file {path!r} is not JSON{where}") from None
    if not isinstance(data, dict) or "benchmarks" not in data:
        raise ResultsFileError(f"{path} is not pytest-benchmark JSON (no 'benchmarks' key)")
    benches = data["benchmarks"]
    if not isinstance(benches, list):
        raise ResultsFileError(f"{path}: 'benchmarks' is {type(benches).__name__}, not a list of cases")
    for index, bench in enumerate(benches):
        problem = _case_problem(bench)
        if problem:
            raise ResultsFileError(f"{path}: benchmarks[{index}] {problem}")
    for key in ("machine_info", "commit_info"):
        if not isinstance(data.get(key, {}), dict):
            raise ResultsFileError(f"{path}: {key!r} is not an object")
    if not isinstance(data.get("machine_info", {}).get("grpo_bench", {}), dict):
        raise ResultsFileError(f"{path}: 'machine_info.grpo_bench' is not an object")
    skipped = data.get("skipped", [])
    if not isinstance(skipped, list) or not all(isinstance(s, dict) and isinstance(s.get("nodeid"), str)
                                                and isinstance(s.get("reason"), str) for s in skipped):
        raise ResultsFileError(f"{path}: 'skipped' is not a list of {{'nodeid', 'reason'}} texts")
    if not any(isinstance(b, dict) and "path" in b.get("extra_info", {}) for b in benches) and not data.get("skipped"):
        raise ResultsFileError(f"{path} holds no case of this suite (none of its benchmarks records a path): run "
                               f"`pytest benchmarks/suite/` to write one")
    return data
