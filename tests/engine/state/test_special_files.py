"""Every reader of a file the engine did not write (a config file, a dataset, a run directory's logs and a
checkpoint's state) refuses a path that is not a regular file before opening it: a FIFO blocked open() until a
writer came (a hang), /dev/zero never ended, a link to /dev/null read as an empty file. One table of special files
against every reader."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from grpo_engine.config.errors import ConfigError
from grpo_engine.config.strict_yaml import read_yaml
from grpo_engine.data.prompts import DataError, load_rows
from grpo_engine.state.bounded_read import FileBoundError, bounded_lines, read_bounded_bytes, read_json_file
from grpo_engine.state.metrics import jsonl_rows, read_metrics


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _link(target: str):
    def make(path: Path) -> Path:
        path.symlink_to(target)
        return path
    return make


SPECIAL = {
    "fifo": (_fifo, "a FIFO"),
    "link to /dev/zero": (_link("/dev/zero"), "a character device"),
    "link to /dev/null": (_link("/dev/null"), "a character device"),
}
READERS = {
    "config file": (lambda p: read_yaml(p), ConfigError, "config.yaml"),
    "JSONL dataset": (lambda p: load_rows(str(p)), DataError, "data.jsonl"),
    "JSON dataset": (lambda p: load_rows(str(p)), DataError, "data.json"),
    "parquet dataset": (lambda p: load_rows(str(p)), DataError, "data.parquet"),
    "metrics log": (lambda p: list(jsonl_rows(p)), FileBoundError, "metrics.jsonl"),
    "plot's metrics": (lambda p: read_metrics(p.parent), FileBoundError, "metrics.jsonl"),
    "checkpoint state": (lambda p: read_json_file(p, "a checkpoint's state"), FileBoundError, "trainer_state.json"),
    "bounded bytes": (lambda p: read_bounded_bytes(p, 1 << 20, "a file"), FileBoundError, "x.bin"),
    "bounded lines": (lambda p: list(bounded_lines(p, 1 << 20, "a log")), FileBoundError, "x.jsonl"),
}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX special files")
@pytest.mark.parametrize("special", sorted(SPECIAL))
@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_special_file_is_refused_by_every_reader_before_it_is_opened(tmp_path, special, reader):
    make, kind = SPECIAL[special]
    read, error, name = READERS[reader]
    path = make(tmp_path / name)
    outcome: list[BaseException] = []

    def attempt():
        try:
            read(path)
        except BaseException as exc:  # noqa: BLE001 - the outcome is checked below
            outcome.append(exc)
    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(20)
    if worker.is_alive():  # unblock the FIFO's open() so the thread can end
        with open(path, "wb"):
            pass
        pytest.fail(f"the {reader} reader blocked on {special}")
    assert outcome and isinstance(outcome[0], error), outcome
    assert kind in str(outcome[0]) and str(path) in str(outcome[0]), outcome[0]


ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]


def _jsonl(rows) -> bytes:
    import json
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


@pytest.mark.parametrize("layout", ["bom at start", "bom in a concatenated file", "json array with bom"])
def test_a_utf8_byte_order_mark_is_not_part_of_a_row(tmp_path, layout):
    bom = b"\xef\xbb\xbf"
    if layout == "bom at start":
        path, data = tmp_path / "d.jsonl", bom + _jsonl(ROWS)
    elif layout == "bom in a concatenated file":
        path, data = tmp_path / "d.jsonl", bom + _jsonl(ROWS[:1]) + bom + _jsonl(ROWS[1:])
    else:
        import json
        path, data = tmp_path / "d.json", bom + json.dumps(ROWS).encode()
    path.write_bytes(data)
    assert load_rows(str(path)) == ROWS


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_a_directory_of_shards_of_one_format_is_read_in_name_order(tmp_path, suffix):
    import json
    shards = tmp_path / "shards"
    shards.mkdir()
    for i, row in enumerate(ROWS):
        path = shards / f"part-{i}{suffix}"
        if suffix == ".parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq
            pq.write_table(pa.Table.from_pylist([row]), path)
        else:
            path.write_text(json.dumps([row]) if suffix == ".json" else json.dumps(row) + "\n")
    (shards / "_SUCCESS").write_text("")  # what Spark writes beside its shards: not data
    assert load_rows(str(shards)) == ROWS


@pytest.mark.parametrize("content,expected", [
    ({}, "it is empty"),
    ({"a.jsonl": _jsonl(ROWS), "notes.txt": b"x"}, "it holds notes.txt"),
    ({"a.jsonl": _jsonl(ROWS), "b.json": b"[]"}, "it mixes .json, .jsonl"),
])
def test_a_directory_that_is_not_a_dataset_is_named_with_what_it_holds(tmp_path, content, expected):
    folder = tmp_path / "data"
    folder.mkdir()
    for name, data in content.items():
        (folder / name).write_bytes(data)
    with pytest.raises(DataError, match=f"neither a datasets directory .*: {expected}"):
        load_rows(str(folder))
