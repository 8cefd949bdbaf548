"""Every file the engine reads back is read within a bound: past it, or nested past Python's JSON reader, one line
naming the file (and line) and the bound. A log row whose step the engine never writes is left out, named."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.data import prompts
from grpo_engine.data.prompts import DataError, load_rows
from grpo_engine.state import bounded_read
from grpo_engine.state.bounded_read import FileBoundError
from grpo_engine.state.checkpoint import MANIFEST_FILE, STATE_FILE, checkpoint_problems, list_checkpoints
from grpo_engine.state.metrics import read_metrics

DEEP = "[" * 100_000 + "]" * 100_000


def _checkpoint(run_dir, name="checkpoint-000002", state=None):
    path = run_dir / "checkpoints" / name
    path.mkdir(parents=True)
    state = state if state is not None else {"step": 2}
    (path / STATE_FILE).write_text(json.dumps({"sampler": {"epoch": 0, "offset": 0}, **state}))
    (path / MANIFEST_FILE).write_text("{}")
    return path


@pytest.mark.parametrize("content, expected", [
    (lambda: "{\"step\": 2, \"pad\": \"" + "x" * (bounded_read.STATE_FILE_BYTES + 1) + "\"}", "larger than 16 MiB"),
    (lambda: DEEP, "JSON nested too deep to read"),
    (lambda: "{\"step\": \"2\"}", "holds step '2', not the 2 of the directory's name"),
    (lambda: "{\"step\": 7}", "holds step 7, not the 2 of the directory's name"),
])
def test_a_checkpoint_state_file_past_a_bound_or_not_the_engines_is_named(tmp_path, content, expected):
    path = _checkpoint(tmp_path)
    (path / STATE_FILE).write_text(content())
    problems = checkpoint_problems(path)
    assert any(STATE_FILE in p and expected in p for p in problems), problems


def test_a_checkpoint_manifest_past_its_bound_is_named(tmp_path):
    path = _checkpoint(tmp_path)
    (path / MANIFEST_FILE).write_text(DEEP)
    assert any(MANIFEST_FILE in p and "nested too deep" in p for p in checkpoint_problems(path))


def test_a_metrics_line_past_its_bound_is_one_line_naming_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setattr("grpo_engine.state.metrics.RUN_LOG_LINE_BYTES", 1000)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n' + '{"step": 2, "x": "' + "y" * 5000 + '"}\n')
    with pytest.raises(FileBoundError, match=r"metrics.jsonl:2: a line longer than 0.000953674 MiB"):
        read_metrics(tmp_path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(step=st.one_of(st.text(max_size=5), st.floats(allow_nan=False), st.integers(max_value=-1), st.booleans(),
                 st.none(), st.lists(st.integers(), max_size=2), st.just("missing")))
def test_a_log_row_whose_step_the_engine_never_writes_is_left_out_and_named(step, tmp_path_factory, capsys):
    capsys.readouterr()
    run_dir = tmp_path_factory.mktemp("run")
    odd = {"reward": 0.5} if step == "missing" else {"step": step, "reward": 0.5}
    if isinstance(step, float) and step.is_integer() and step >= 0:
        odd["step"] = str(step)  # json would write 3.0, which reads back as a float: not an engine step
    lines = [json.dumps({"step": 1, "reward": 0.1}), json.dumps(odd), json.dumps({"step": 2, "reward": 0.2})]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert [row["step"] for row in read_metrics(run_dir)] == [1, 2]
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "metrics.jsonl: line 2 has \"step\"" in err, err


def test_a_data_row_past_its_bound_or_nested_too_deep_is_one_line(tmp_path, monkeypatch):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "a"}\n{"prompt": ' + DEEP + "}\n")
    with pytest.raises(DataError, match=r"d.jsonl:2: JSON nested too deep"):
        load_rows(str(data))
    monkeypatch.setattr(prompts, "DATA_LINE_BYTES", 100)
    data.write_text('{"prompt": "a"}\n{"prompt": "' + "b" * 500 + '"}\n')
    with pytest.raises(DataError, match=r"d.jsonl:2: a line longer than"):
        load_rows(str(data))
    whole = tmp_path / "d.json"
    whole.write_text(json.dumps([{"prompt": "b" * 500}]))
    with pytest.raises(DataError, match=r"d.json: larger than .* write it as JSONL"):
        load_rows(str(whole))


@pytest.mark.parametrize("name", ["checkpoint-000002-keep", "checkpoint-2", "checkpoint-000002.bak", "checkpoint-",
                                  "checkpoint-00000x"])
def test_a_copy_under_a_name_the_engine_does_not_write_is_not_a_checkpoint(tmp_path, name):
    _checkpoint(tmp_path, "checkpoint-000001", {"step": 1})
    _checkpoint(tmp_path, name, {"step": 2})
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-000001"]
