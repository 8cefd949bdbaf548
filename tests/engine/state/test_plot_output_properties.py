"""`grpo-engine plot RUN_DIR --output NAME`: a name whose suffix is an image format matplotlib writes (any case, or no
suffix: PNG) is plotted, and the path printed is the file written; any other suffix (a run's own metrics.jsonl,
`.txt`, `.json`, text of any kind) is one line naming --output before the metrics are read (hypothesis). Before,
matplotlib refused it after reading and drawing, in a message naming no option."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import main
from grpo_engine.state import plot

matplotlib = pytest.importorskip("matplotlib")
FORMATS = sorted(plot.image_formats())
SUFFIXES = st.one_of(st.just(""), st.sampled_from(FORMATS), st.sampled_from(FORMATS).map(str.upper),
                     st.sampled_from(["jsonl", "json", "txt", "yaml", "py", "png.bak", "p ng"]),
                     st.text(st.characters(categories=("L", "N")), min_size=1, max_size=6))


class PlotStarted(Exception):
    pass


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(suffix=SUFFIXES)
def test_an_output_of_an_image_format_is_plotted_and_any_other_is_one_line(suffix, tmp_path_factory, monkeypatch,
                                                                           capsys):
    root = tmp_path_factory.mktemp("plot")
    (root / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")

    def started(*args, **kwargs):
        raise PlotStarted

    monkeypatch.setattr(plot, "plot_run", started)
    output = root / (f"curves.{suffix}" if suffix else "curves")
    try:
        outcome = main(["plot", str(root), "--output", str(output)])
    except PlotStarted:
        outcome = "started"
    lines = capsys.readouterr().err.splitlines()
    if not suffix or suffix.lower() in FORMATS:
        assert outcome == "started", lines
        return
    assert outcome != "started" and len(lines) == 1 and "--output" in lines[0] and "Traceback" not in lines[0], lines


@pytest.mark.parametrize("name, written", [("curves", "curves.png"), ("c.SVG", "c.SVG"), ("c.pdf", "c.pdf")])
def test_the_path_printed_is_the_file_written(name, written, tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")
    assert plot.plot_run(tmp_path, tmp_path / name) == tmp_path / written
    assert (tmp_path / written).stat().st_size > 0
