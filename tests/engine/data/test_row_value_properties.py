"""Whatever a dataset file holds, its rows load as JSON's values (text, finite numbers, booleans, null, lists,
objects) or the load stops in one line naming the file and line, or the row and column (hypothesis). Hostile values
are drawn into random columns of random rows of JSONL, JSON-array and Parquet files: NaN / Infinity literals,
numbers that overflow a float, integers too long for Python to read, lone UTF-16 surrogates in values and keys.
Then the columns a reward function reads are checked: an answer of a type math_accuracy would read as text
silently, and a column named as an argument the engine passes itself."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.config import RewardsConfig
from grpo_engine.data.prompts import DataError, load_prompt_rows
from grpo_engine.steps.rewards import (ANSWER_TYPES, ENGINE_ARGUMENTS, NamedReward, RewardFunctionError,
                                       check_reward_columns, make_math_accuracy)

# JSON text of a value a row may not hold, and how a reader that took it would see it.
HOSTILE_JSON = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-2.5e999", "9" * 4301, "-" + "1" * 5000,
                                '"\\ud800"', '"ok \\udfff"', '["x", {"deep": NaN}]', '{"\\ud83d": 1}'])
NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8)
# integers of any length Python reads: 309 to 4,300 digits (past a float's range) raised an OverflowError traceback
LONG_INTEGERS = st.tuples(st.sampled_from(["", "-"]), st.integers(1, 9), st.integers(300, 4299)).map(
    lambda parts: f"{parts[0]}{parts[1]}{'0' * parts[2]}")
FINE_JSON = st.one_of(st.integers(-10**6, 10**6).map(str), LONG_INTEGERS,
                      st.floats(allow_nan=False, allow_infinity=False).map(repr),
                      NAMES.map(json.dumps), st.sampled_from(["true", "false", "null", "[]", "{}"]))


def _fine(value) -> bool:
    """What a loaded row may hold: JSON's values, every number finite, every text encodable."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_fine(k) and _fine(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_fine(v) for v in value)
    return value is None or isinstance(value, (bool, int))


def _one_line_naming(message: str, path: str) -> bool:
    return "\n" not in message and path in message and len(message) < 400


@st.composite
def hostile_files(draw):
    """(rows as JSON object texts, the row and column that hold a hostile value, or None)."""
    count = draw(st.integers(1, 4))
    rows = [{"prompt": json.dumps(f"{i}+1="), **{f"c{j}": draw(FINE_JSON) for j in range(draw(st.integers(0, 2)))}}
            for i in range(count)]
    hostile = draw(st.booleans())
    if hostile:
        row, column = draw(st.integers(0, count - 1)), draw(st.sampled_from(["answer", "extra", "prompt"]))
        rows[row][column] = draw(HOSTILE_JSON)
    return ["{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in row.items()) + "}" for row in rows]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=hostile_files(), layout=st.sampled_from(["jsonl", "json"]))
def test_a_data_file_loads_as_json_values_or_one_line_names_where(lines, layout, tmp_path):
    path = tmp_path / f"data.{layout}"
    path.write_text("\n".join(lines) + "\n" if layout == "jsonl" else "[" + ",\n".join(lines) + "]")
    try:
        rows = load_prompt_rows(str(path), "prompt", None)
    except DataError as exc:
        assert _one_line_naming(str(exc), str(path)), str(exc)
        return
    assert all(_fine(row) for row in rows), rows


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.one_of(st.floats(), st.text(max_size=5), st.none()), min_size=1, max_size=5))
def test_a_parquet_file_with_nan_or_infinite_floats_is_named_by_row_and_column(values, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    numbers = [v if isinstance(v, float) else 1.0 for v in values]
    pq.write_table(pa.table({"prompt": [f"{i}+1=" for i in range(len(values))], "weight": numbers}),
                   tmp_path / "d.parquet")
    bad = next((i for i, v in enumerate(numbers) if not math.isfinite(v)), None)
    if bad is None:
        assert [r["weight"] for r in load_prompt_rows(str(tmp_path / "d.parquet"), "prompt", None)] == numbers
        return
    with pytest.raises(DataError) as refused:
        load_prompt_rows(str(tmp_path / "d.parquet"), "prompt", None)
    assert f"row {bad} column 'weight'" in str(refused.value) and "\n" not in str(refused.value)


ANSWERS = st.one_of(st.text(max_size=6), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.none(),
                    st.booleans(), st.lists(st.integers(), max_size=2), st.dictionaries(NAMES, st.integers(),
                                                                                        max_size=2))


@settings(max_examples=80, deadline=None)
@given(answers=st.lists(ANSWERS, min_size=1, max_size=4),
       extra=st.sampled_from(ENGINE_ARGUMENTS + ("notes", "completion", "prompt_id")))
def test_the_columns_a_reward_reads_hold_its_types_and_no_column_takes_an_engine_argument(answers, extra):
    rows = [{"prompt": "1+1=", "answer": answer, extra: "x"} for answer in answers]
    config = RewardsConfig()
    reward = NamedReward("math_accuracy", make_math_accuracy(config.math_correct, config.math_wrong,
                                                             config.math_no_answer, "answer"), 1.0)
    readable = all(isinstance(a, ANSWER_TYPES) and not isinstance(a, bool) for a in answers)
    try:
        check_reward_columns([reward], rows, "d.jsonl", "prompt")
    except RewardFunctionError as exc:
        message = str(exc)
        assert "\n" not in message and "'d.jsonl' row " in message and len(message) < 400, message
        assert extra in ENGINE_ARGUMENTS or not readable, message
        assert (f"column {extra!r}" in message) if extra in ENGINE_ARGUMENTS else "column 'answer'" in message
        return
    assert readable and extra not in ENGINE_ARGUMENTS
