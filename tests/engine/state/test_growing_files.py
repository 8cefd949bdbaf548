"""A file written to while it is read (a run's metrics.jsonl as `plot` reads it, a dataset still being generated)
is read as it was when opened: drawn files grow by drawn amounts with every line read, and the lines read are
exactly the ones the file held at the start, its last unfinished line included. Before, each line read brought
more, and the reader never ended (nor did its memory)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.state.bounded_read import bounded_lines

LINE = st.binary(min_size=0, max_size=40).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b""))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(LINE, max_size=12), unfinished=st.none() | LINE.filter(bool),
       growth=st.lists(LINE, min_size=1, max_size=5))
def test_a_file_growing_while_read_is_read_as_it_was_opened(lines, unfinished, growth, tmp_path_factory):
    path = tmp_path_factory.mktemp("growing") / "growing.jsonl"
    start = b"".join(line + b"\n" for line in lines) + (unfinished or b"")
    path.write_bytes(start)
    read = []
    for number, raw in bounded_lines(path, 1000, "a test file"):
        read.append(raw)
        with path.open("ab") as file:  # the writer goes on as the reader reads
            file.write(b"".join(g + b"\n" for g in growth))
        assert len(read) <= len(lines) + 1, "read past what the file held when opened"
    assert read == lines + ([unfinished] if unfinished else [])
