"""stdout in an encoding that cannot hold every letter (an ASCII or Latin-1 locale, PYTHONIOENCODING=ascii, a
Windows console): what the CLI prints is escaped, never a UnicodeEncodeError. Before, a plot written to a run
directory named in other letters was reported failed (exit status 1) as it printed its path, and so was the last
line of a run that had trained and saved."""

from __future__ import annotations

import io
import json
import sys

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import main

NAMES = st.text(st.sampled_from("abcé€ößñ中😀 -_"), min_size=1, max_size=12).filter(
    lambda name: name.strip(" .") and not name.isascii())


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NAMES, encoding=st.sampled_from(["ascii", "latin-1", "cp1252"]))
def test_a_path_in_letters_stdout_cannot_encode_is_printed_escaped(name, encoding, tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / name
    run_dir.mkdir(exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward": s / 4}) + "\n" for s in (1, 2, 3)))
    raw = io.BytesIO()
    stdout = io.TextIOWrapper(raw, encoding=encoding, errors="strict", write_through=True)
    monkeypatch.setattr(sys, "stdout", stdout)
    code = main(["plot", str(run_dir)])
    stdout.flush()
    err = capsys.readouterr().err
    assert code == 0, err
    assert (run_dir / "curves.png").stat().st_size > 0
    printed = raw.getvalue().decode(encoding).strip()
    # the path, each letter the encoding lacks written as its escape (as Python's own stderr writes it)
    assert printed == str(run_dir / "curves.png").encode(encoding, "backslashreplace").decode(encoding), printed
