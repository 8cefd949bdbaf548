"""A path the command reads (`--config`, `plot RUN_DIR`) that is a link leading nowhere, a loop of links or a
dangling link, anywhere on the path: one line naming the link and what it leads to. Before, --config said "does not
exist" and plot "is it a run directory?", naming no link."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import main


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(["config", "plot"]), loop=st.booleans(), below=st.booleans())
def test_a_link_leading_nowhere_is_named(command, loop, below, tmp_path_factory, capsys):
    root = tmp_path_factory.mktemp("links")
    link = root / "a"
    if loop:
        (root / "b").symlink_to("a")
        link.symlink_to("b")
    else:
        link.symlink_to(root / "gone")
    path = link / "config.yaml" if below else link
    argv = ["train", "--config", str(path), "--run.max_steps", "1"] if command == "config" else ["plot", str(path)]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(link) in err[0] and ("leads back to itself" if loop else "does not exist") in err[0]
