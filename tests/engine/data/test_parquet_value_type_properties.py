"""A Parquet column of a type JSON has no value for (binary, timestamps, dates, times, durations, decimals, alone or
inside a list or a struct) stops the load in one line naming the file, the row, the column and the Python type, as
the docs promise rows of JSON's values only. Before, pyarrow's bytes, datetime and Decimal objects reached the
prompt renderer and every reward function as they were. Columns of JSON's types (text, integers, floats, booleans,
nulls, lists and structs of them) load as before (hypothesis draws the type, the nesting and the row)."""

from __future__ import annotations

import datetime
import decimal
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

from grpo_engine.data.prompts import DataError, load_rows

# (pyarrow type, a value of it, the Python type pyarrow gives back)
NON_JSON = [(pa.binary(), b"\x00ab", "bytes"), (pa.large_binary(), b"x", "bytes"),
            (pa.timestamp("us"), datetime.datetime(2024, 1, 2, 3, 4), "datetime.datetime"),
            (pa.date32(), datetime.date(2024, 1, 2), "datetime.date"),
            (pa.time64("us"), datetime.time(3, 4), "datetime.time"),
            (pa.duration("s"), datetime.timedelta(seconds=5), "datetime.timedelta"),
            (pa.decimal128(10, 2), decimal.Decimal("12.50"), "decimal.Decimal")]
JSON_TYPES = [(pa.string(), "42"), (pa.int64(), 42), (pa.float64(), 4.5), (pa.bool_(), True),
              (pa.list_(pa.string()), ["a", "b"]), (pa.struct([("k", pa.int32())]), {"k": 1})]
NESTINGS = ["alone", "list", "struct"]


def nested(kind: pa.DataType, value, nesting: str) -> tuple[pa.DataType, object]:
    if nesting == "list":
        return pa.list_(kind), [value]
    if nesting == "struct":
        return pa.struct([("inner", kind)]), {"inner": value}
    return kind, value


def write(path: Path, kind: pa.DataType, values: list) -> None:
    table = pa.table({"prompt": pa.array([f"q{i}" for i in range(len(values))]), "extra": pa.array(values, kind)})
    pq.write_table(table, path)


@settings(max_examples=40, deadline=None)
@given(case=st.sampled_from(NON_JSON), nesting=st.sampled_from(NESTINGS), rows=st.integers(1, 4),
       data=st.data())
def test_a_column_of_no_json_type_is_one_line(case, nesting, rows, data):
    kind, value, python_type = case
    row = data.draw(st.integers(0, rows - 1))
    kind, held = nested(kind, value, nesting)
    values = [None] * rows
    values[row] = held
    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "data.parquet"
        write(path, kind, values)
        with pytest.raises(DataError) as refused:
            load_rows(str(path))
    message = str(refused.value)
    assert "\n" not in message and f"row {row} column 'extra' holds a {python_type} value" in message, message
    assert "store that column as text or numbers" in message and "data.parquet" in message, message


@settings(max_examples=20, deadline=None)
@given(case=st.sampled_from(JSON_TYPES), nesting=st.sampled_from(NESTINGS))
def test_a_column_of_a_json_type_loads(case, nesting):
    kind, held = nested(*case, nesting)
    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "data.parquet"
        write(path, kind, [held, None])
        rows = load_rows(str(path))
    assert rows == [{"prompt": "q0", "extra": held}, {"prompt": "q1", "extra": None}]
