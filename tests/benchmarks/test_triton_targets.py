"""benchmarks/model/triton_targets.py: the workspace at which the model puts the Triton path within its targets."""

from dataclasses import replace

import pytest

from benchmarks.model import triton_targets
from benchmarks.model.triton_targets import (MAX_WORKSPACE, MEMORY_TARGET_X_CCE, TIME_TARGET_X_FLOOR, WORKSPACE_STEP,
                                             target_problem, within_targets, workspace_within_targets)


@pytest.mark.parametrize("shape", ["S1", "S2", "S3"])
@pytest.mark.parametrize("scenario", ["token-level", "sequence-level"])
def test_a_trained_head_meets_both_triton_targets_somewhere(shape, scenario):
    """The performance issue's Triton targets for a trained head, by the model, at every target shape."""
    p = target_problem(shape, scenario)
    workspace = workspace_within_targets(p)
    assert workspace is not None
    time, memory = within_targets(replace(p, workspace_bytes=workspace))
    assert time <= TIME_TARGET_X_FLOOR and memory <= MEMORY_TARGET_X_CCE
    # the fastest of the workspaces within both
    for other in range(WORKSPACE_STEP, MAX_WORKSPACE + 1, WORKSPACE_STEP):
        other_time, other_memory = within_targets(replace(p, workspace_bytes=other))
        assert not (other_time < time and other_memory <= MEMORY_TARGET_X_CCE
                    and other_time <= TIME_TARGET_X_FLOOR), other


def test_none_when_no_workspace_meets_them(monkeypatch):
    monkeypatch.setattr(triton_targets, "TIME_TARGET_X_FLOOR", 1.0)  # the floor itself: no fused path reaches it
    assert workspace_within_targets(target_problem("S1", "token-level")) is None


def test_report_lists_every_shape_and_scenario():
    text = triton_targets.report()
    for shape in ("S1", "S2", "S3"):
        for scenario in ("token-level", "sequence-level", "frozen head"):
            assert f"| {shape} | {scenario} |" in text


def test_docs_block_is_current():
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "benchmarks.md")) as f:
        docs = f.read()
    begin, end = "<!-- triton-targets:begin -->\n", "<!-- triton-targets:end -->"
    assert docs[docs.index(begin) + len(begin):docs.index(end)] == triton_targets.report(), (
        "docs/benchmarks.md's triton-targets block is stale: paste `python -m benchmarks.model.triton_targets`")
