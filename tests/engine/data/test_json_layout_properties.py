"""Property test of the layouts a JSON data file is written in: rows load from one object a line (JSONL, in a .jsonl
or a .json file) or from one array of objects in a .json file; any other layout of valid JSON is one line naming
the file and the lines the value spans, what it is and how to write it. Before, a pretty-printed file
(`json.dump(rows, f, indent=2)`, a `{"data": [...]}` wrapper, an array in a .jsonl file) was "FILE:1: invalid JSON
(Expecting property name ...)" although it was valid JSON, and a row that is not an object "FILE: row 0 is not a JSON
object", naming no line."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_engine.data.prompts import DataError, load_rows

DERANDOMIZE = bool(os.environ.get("CI"))
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=6)
ROWS = st.lists(st.fixed_dictionaries({"prompt": TEXT}, optional={"answer": st.integers() | TEXT}), min_size=1,
                max_size=4)
NOT_OBJECTS = st.one_of(st.integers(), TEXT, st.none(), st.booleans(), st.lists(st.integers(), max_size=2),
                        st.lists(st.fixed_dictionaries({"prompt": TEXT}), min_size=1, max_size=2))
INDENT = st.integers(1, 4)


def _written(rows, layout: str, indent: int) -> tuple[str, tuple[int, int] | None]:
    """The file's text, and the lines (first, last) of the value the reader must name, None when the rows load."""
    if layout == "jsonl":
        return "".join(json.dumps(row) + "\n" for row in rows), None
    if layout == "array":
        return json.dumps(rows, indent=indent), None
    if layout == "pretty objects":  # json.dump(row, f, indent=k) one after another
        text = "\n".join(json.dumps(row, indent=indent) for row in rows)
        return text + "\n", (1, json.dumps(rows[0], indent=indent).count("\n") + 1)
    if layout == "pretty array in jsonl":
        text = json.dumps(rows, indent=indent)
        return text, (1, text.count("\n") + 1)
    text = json.dumps({"data": rows}, indent=indent)  # a wrapper object
    return text, (1, text.count("\n") + 1)


@settings(max_examples=120, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=ROWS, layout=st.sampled_from(["jsonl", "array", "pretty objects", "pretty array in jsonl", "wrapper"]),
       suffix=st.sampled_from([".jsonl", ".json"]), indent=INDENT)
def test_a_json_file_loads_its_rows_or_names_the_lines_of_what_it_holds(rows, layout, suffix, indent, tmp_path):
    if layout == "array":
        suffix = ".json"  # an array is a .json file's form
    if layout == "pretty array in jsonl":
        suffix = ".jsonl"
    text, spread = _written(rows, layout, indent)
    path = tmp_path / f"data{suffix}"
    path.write_text(text)
    if spread is None:
        assert load_rows(str(path)) == rows
        return
    with pytest.raises(DataError) as caught:
        load_rows(str(path))
    message = str(caught.value)
    assert "\n" not in message and "invalid JSON" not in message, message
    assert message.startswith(f"{path}:{spread[0]}-{spread[1]}: one JSON "), message
    assert "one row a line" in message


@settings(max_examples=80, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=ROWS, value=NOT_OBJECTS, data=st.data())
def test_a_row_that_is_not_an_object_is_named_by_its_line(rows, value, data, tmp_path):
    at = data.draw(st.integers(0, len(rows)), label="at")
    lines = [json.dumps(row) for row in rows]
    lines.insert(at, json.dumps(value))
    blank = data.draw(st.booleans(), label="blank line first")  # blank lines count as lines, not as rows
    path = tmp_path / "data.jsonl"
    path.write_text("\n" * blank + "\n".join(lines) + "\n")
    with pytest.raises(DataError) as caught:
        load_rows(str(path))
    message = str(caught.value)
    assert message.startswith(f"{path}:{at + 1 + blank}: the row is "), message
    assert "not a JSON object of columns" in message and "\n" not in message
    if isinstance(value, list):
        assert "an array of rows belongs in a .json file" in message
