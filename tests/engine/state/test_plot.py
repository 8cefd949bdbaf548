"""`grpo-engine plot`: one panel per curve the run logged, and docs that say which."""

import json

import pytest

from grpo_engine.state.plot import CURVES, panels, plot_run

from repo_paths import ROOT


def test_a_run_without_kl_has_no_kl_panel(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [{"step": s, "reward": 0.1 * s, "entropy": 1.0, "kl": None} for s in (1, 2, 3)]  # beta = 0: kl null
    assert [key for key, _ in panels(rows)] == ["reward", "entropy"]
    assert [key for key, _ in panels([{**rows[0], "kl": 0.01}])] == ["reward", "kl", "entropy"]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert plot_run(tmp_path).stat().st_size > 0


@pytest.mark.parametrize("document", ["README.md", "docs/engine.md"])
def test_the_docs_name_the_curves_the_plot_has(document):
    text = " ".join((ROOT / document).read_text().split())
    assert CURVES in text and "reward / KL / entropy" not in text
