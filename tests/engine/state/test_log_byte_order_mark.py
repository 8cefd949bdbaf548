"""A run's metrics.jsonl / samples.jsonl whose lines open with a UTF-8 byte order mark (an editor saved the log,
two such files concatenated) reads as the same rows, as data files do. Before, plot and resume refused the
readable log: "line 1 is not a JSON object: '\\ufeff{...'"."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.state.metrics import jsonl_rows, read_metrics

BOM = b"\xef\xbb\xbf"
ROW = st.fixed_dictionaries({"step": st.integers(0, 10**6)},
                            optional={"reward": st.floats(-1, 1), "eval_accuracy": st.floats(0, 1)})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(ROW, min_size=1, max_size=6), marked=st.data())
def test_a_byte_order_mark_opening_a_line_is_no_part_of_its_row(rows, marked, tmp_path):
    marks = marked.draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows)).filter(any))
    text = b"".join((BOM if mark else b"") + json.dumps(row).encode() + b"\n" for row, mark in zip(rows, marks))
    (tmp_path / "metrics.jsonl").write_bytes(text)
    assert read_metrics(tmp_path) == rows
    assert [line for _, line in jsonl_rows(tmp_path / "metrics.jsonl")] == [json.dumps(row) for row in rows]
