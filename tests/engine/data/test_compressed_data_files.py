"""A data file shipped compressed or archived but named .jsonl / .json (a download kept as it came, `gzip -k` then a
rename) is one line naming the file and the format, before any row is read; it was "FILE:1: not valid UTF-8 (byte
0x8b ...)" for gzip, and an invalid-JSON line for a zip archive whose first bytes happen to decode."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import zipfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_engine.data.prompts import DataError, load_rows

DERANDOMIZE = bool(os.environ.get("CI"))
ROWS = st.lists(st.fixed_dictionaries({"prompt": st.text(max_size=8)}), min_size=1, max_size=4)


def _zip(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("train.jsonl", data)
    return buffer.getvalue()


PACKERS = {"gzip-compressed": gzip.compress, "bzip2-compressed": bz2.compress, "xz-compressed": lzma.compress,
           "a zip archive": _zip}


@settings(max_examples=30, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=ROWS, kind=st.sampled_from(sorted(PACKERS)), suffix=st.sampled_from([".jsonl", ".json"]),
       array=st.booleans())
def test_a_compressed_or_archived_data_file_is_named_with_its_format(tmp_path, rows, kind, suffix, array):
    text = json.dumps(rows) if array and suffix == ".json" else "".join(json.dumps(row) + "\n" for row in rows)
    path = tmp_path / f"train{suffix}"
    path.write_bytes(PACKERS[kind](text.encode()))
    with pytest.raises(DataError) as refused:
        load_rows(str(path))
    assert str(refused.value) == f"{path}: the file is {kind}, not text; unpack it and name the {suffix} file inside"
    path.write_text(text, encoding="utf-8")  # the same rows unpacked load
    assert load_rows(str(path)) == rows
