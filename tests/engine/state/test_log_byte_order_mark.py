"""A run's metrics.jsonl / samples.jsonl whose lines open with a UTF-8 byte order mark (an editor saved the log,
two such files concatenated) reads as the same rows, as data files do. Before, plot and resume refused the
readable log: "line 1 is not a JSON object: '\\ufeff{...'". A log saved in another encoding (UTF-16, UTF-32) is
said to be one, in a line."""

from __future__ import annotations

import json

import pytest
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


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(ROW, min_size=1, max_size=4), encoding=st.sampled_from(["utf-16", "utf-16-le", "utf-16-be",
                                                                              "utf-32", "utf-32-le"]))
def test_a_log_saved_in_another_encoding_is_named_as_not_utf8(rows, encoding, tmp_path):
    """An editor that saves the log as UTF-16 or UTF-32: one line saying the file is not UTF-8, not the mojibake of
    its first line (a one-line log was left out as "cut off mid-write", and plot then found nothing to draw)."""
    text = "".join(json.dumps(row) + "\n" for row in rows).encode(encoding)
    (tmp_path / "metrics.jsonl").write_bytes(text)
    with pytest.raises(ValueError) as refused:
        read_metrics(tmp_path)
    message = str(refused.value)
    assert "\n" not in message and "is not UTF-8 text" in message and "save the file as UTF-8" in message, message
    assert "\\x00" not in message, message
