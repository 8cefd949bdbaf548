"""A benchmark results file edited, cut off, of another program or of the wrong type in any field the report reads:
`python -m benchmarks.suite.report` reads it and renders the report, or stops in one line naming the file (and the
field), with exit status 2 (hypothesis). The oracle for a file it reads is the report itself: every table renders.
Before, json's and the report's own exceptions came out as tracebacks, and a file of no case of this suite printed
an empty report; `--out` naming the results file replaced it with the report. A path or operation outside the
report's lists (a near miss of one: `Reference`, `losss`) dropped the case's row silently, the reference's taking
every speedup with it."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from benchmarks.suite import report
from benchmarks.suite.cases import LOSS_CASES, OPERATIONS, REGIMES
from benchmarks.suite.paths import PATHS, ROUTED
from benchmarks.suite.results_file import CASE_COUNTS, CASE_TEXT, OPTIONAL_COUNTS, OPTIONAL_NUMBERS
from benchmarks.suite.shapes import DTYPES

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _case(path: str, median_s: float) -> dict:
    info = {"path": path, "operation": "loss", "config": "dapo", "regime": "flat", "head": "h", "hidden": 64,
            "vocab": 1000, "tokens": 1024, "dtype": "float32", "flops": 6 * 1024 * 64 * 1000,
            "peak_extra_bytes": 2**20, "mean_entropy": 6.5}
    return {"name": f"test_loss[{path}]", "group": "g", "stats": {"median": median_s}, "extra_info": info}


VALID = {"machine_info": {"grpo_bench": {"device": "Test CPU", "device_type": "cpu"}}, "commit_info": {"id": "abc"},
         "datetime": "2025-01-01", "skipped": [{"nodeid": "t[x]", "reason": "no GPU"}],
         "benchmarks": [_case("reference", 0.004), _case("torch", 0.001), {"name": "other suite", "stats": {}}]}

# Where an edit lands: a key path into the file ("*" the first case of this suite).
FIELDS = ([("benchmarks",), ("benchmarks", "*"), ("benchmarks", "*", "stats"), ("benchmarks", "*", "stats", "median"),
           ("benchmarks", "*", "extra_info"), ("machine_info",), ("machine_info", "grpo_bench"), ("commit_info",),
           ("skipped",), ("skipped", 0), ("skipped", 0, "reason")]
          + [("benchmarks", "*", "extra_info", name)
             for name in (*CASE_TEXT, *CASE_COUNTS, *OPTIONAL_COUNTS, *OPTIONAL_NUMBERS)])
# The names the report and the calibration look up in a fixed list, from the lists themselves
LOOKED_UP = {"path": (*ROUTED, *PATHS, "floor"), "operation": OPERATIONS, "config": ("-", *LOSS_CASES),
             "dtype": tuple(DTYPES), "regime": REGIMES}
# A listed name or a near miss of one: another case, a plural, a cut
_NAMES = sorted({name for choices in LOOKED_UP.values() for name in choices})
NEAR_NAMES = st.sampled_from(_NAMES).flatmap(
    lambda name: st.sampled_from([name, name.upper(), name + "s", name[:-1], f" {name}", name.replace("_", "-")]))
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(), st.text(max_size=4), NEAR_NAMES,
                   st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


def _edited(field: tuple, how: str, value) -> dict:
    data = copy.deepcopy(VALID)
    parent = data
    for key in field[:-1]:
        parent = parent[key] if key != "*" else parent[0]
    key = field[-1] if field[-1] != "*" else 0
    if how == "delete" and isinstance(parent, dict):
        parent.pop(key, None)
    else:
        parent[key] = value
    return data


def _run(argv: list[str], capsys) -> tuple[str, list[str], str]:
    try:
        outcome = str(report.main(argv))
    except SystemExit as stop:
        outcome = str(stop.code)
    captured = capsys.readouterr()
    return outcome, captured.err.splitlines(), captured.out


def _refused_in_one_line(outcome: str, lines: list[str], name: str) -> bool:
    return outcome == "2" and len(lines) == 1 and name in lines[0] and "Traceback" not in lines[0]


@SETTINGS
@given(field=st.sampled_from(FIELDS), how=st.sampled_from(["set", "delete"]), value=VALUES)
def test_an_edited_results_file_renders_or_is_one_line_naming_it(field, how, value, tmp_path, capsys):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_edited(field, how, value)))  # NaN / Infinity as JSON's extension writes them
    outcome, lines, out = _run([str(path), "--no-plots"], capsys)
    name = field[-1]
    if outcome == "0":
        assert "## GRPO loss benchmarks" in out and not lines, lines
        # a name the report looks up in a list is one of the list's: anything else dropped the case's row silently
        assert how == "delete" or name not in LOOKED_UP or value in LOOKED_UP[name], (name, value)
        return
    assert _refused_in_one_line(outcome, lines, str(path)), (outcome, lines)
    if name in LOOKED_UP and how == "set" and isinstance(value, str):
        assert f"extra_info.{name}" in lines[0], lines


@SETTINGS
@given(cut=st.floats(0.0, 0.999), byte=st.sampled_from([None, b"\xff", b"\x00"]))
def test_a_cut_off_or_damaged_results_file_is_one_line_naming_it(cut, byte, tmp_path, capsys):
    text = json.dumps(VALID).encode()
    damaged = text[:int(len(text) * cut)] + (byte or b"")
    path = tmp_path / "results.json"
    path.write_bytes(damaged)
    outcome, lines, _ = _run([str(path), "--no-plots"], capsys)
    assert _refused_in_one_line(outcome, lines, str(path)), (outcome, lines)


@pytest.mark.parametrize("make", ["missing", "directory", "no case of this suite"])
def test_a_results_path_that_holds_no_results_is_one_line(make, tmp_path, capsys):
    path = tmp_path / "results.json"
    if make == "directory":
        path.mkdir()
    elif make == "no case of this suite":
        path.write_text(json.dumps({**VALID, "benchmarks": [VALID["benchmarks"][2]], "skipped": []}))
    outcome, lines, _ = _run([str(path), "--no-plots"], capsys)
    assert _refused_in_one_line(outcome, lines, str(path)), (outcome, lines)


def test_out_naming_a_results_file_is_refused_and_the_file_kept(tmp_path, capsys):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(VALID))
    outcome, lines, _ = _run([str(path), "--out", str(path), "--no-plots"], capsys)
    assert _refused_in_one_line(outcome, lines, "--out") and json.loads(path.read_text()) == VALID


README_TEXT = "# r\n<!-- benchmarks:begin -->\n<!-- benchmarks:end -->\n"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pair=st.sampled_from([("--out", "--plots"), ("--out", "--update-readme")]),  # --plots a file: its type
       spelling=st.sampled_from(["same", "dot", "parent", "symlink"]), readme_first=st.booleans())
def test_two_output_options_naming_one_path_are_refused_before_anything_is_written(pair, spelling, readme_first,
                                                                                  tmp_path, capsys):
    # Before: the report was written to the path, then drawing the plots there failed (FileExistsError), or the
    # README's update silently left --out unwritten
    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))  # one directory per example
    results = tmp_path / "results.json"
    results.write_text(json.dumps(VALID))
    target = tmp_path / "shared.md"
    if "--update-readme" in pair:
        target.write_text(README_TEXT)
    spelt = {"same": str(target), "dot": str(tmp_path / "." / target.name),
             "parent": str(tmp_path / "sub" / ".." / target.name), "symlink": str(tmp_path / "link.md")}[spelling]
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.md").symlink_to(target)
    first, second = pair if readme_first else pair[::-1]
    before = target.read_text() if target.exists() else None
    outcome, lines, _ = _run([str(results), first, str(target), second, spelt], capsys)
    assert _refused_in_one_line(outcome, lines, second) and "give each its own" in lines[0], (outcome, lines)
    assert (target.read_text() if target.exists() else None) == before
