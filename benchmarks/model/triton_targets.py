"""Where the Triton path meets the project's Triton targets by the model: the workspace to measure it at.

The targets (the performance issue's, for the Hopper recipe, `triton_tma`): a loss step within 1.6x its bare-GEMM
floor (three GEMMs with a trained head, two with a frozen one) and a peak extra memory within 1.1x Cut
Cross-Entropy's at the same case. The workspace trades one for the other (backends/triton_tma.py: token chunks
where it is large, two passes where it is small), so the question is at which workspace, if any, the model puts
both within reach; `benchmarks/triton_check.py` times the route there on the next GPU.

    python -m benchmarks.model.triton_targets
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Optional

from .roofline import SCENARIOS, estimate, problem
from .roofline_model import DEVICES, MIB, Problem
from ..suite.shapes import TARGET_SHAPES
from grpo_engine.command_failure import run_tool

TIME_TARGET_X_FLOOR = 1.6
MEMORY_TARGET_X_CCE = 1.1
# the workspaces tried: whole 8 MiB steps up to the GEMM path's default 1 GiB (a chunk's rows go in steps of
# 32 below two token blocks, 9-10 MiB of 16-bit exponentials at V 151936)
WORKSPACE_STEP = 8 * MIB
MAX_WORKSPACE = 1024 * MIB
PATH = "triton_tma"
DEVICE = "H200"  # the GPU the project measured


def within_targets(p: Problem, device: str = DEVICE) -> tuple[float, float]:
    """(time over the floor, peak extra over Cut Cross-Entropy's) of the Triton path on `p`, by the model."""
    rates = DEVICES[device]
    ours = estimate(PATH, p, rates)
    return (ours.seconds(rates) / estimate("floor", p, rates).seconds(rates),
            ours.peak_extra_bytes / estimate("cce", p, rates).peak_extra_bytes)


def workspace_within_targets(p: Problem, device: str = DEVICE) -> Optional[int]:
    """Of the workspaces (WORKSPACE_STEP steps up to MAX_WORKSPACE) at which the model puts the Triton path's loss on
    `p` within both targets, the fastest (the most room under the time target; the smaller on a tie); None where
    no workspace does."""
    within = []
    for workspace in range(WORKSPACE_STEP, MAX_WORKSPACE + 1, WORKSPACE_STEP):
        time, memory = within_targets(replace(p, workspace_bytes=workspace), device)
        if time <= TIME_TARGET_X_FLOOR and memory <= MEMORY_TARGET_X_CCE:
            within.append((time, workspace))
    return min(within)[1] if within else None


def target_problem(shape: str, scenario: str) -> Problem:
    """The Problem of a target shape (S1-S3) in a loss scenario of the roofline ("token-level", "sequence-level",
    "frozen head")."""
    return problem(TARGET_SHAPES[shape], SCENARIOS[scenario])


def report(device: str = DEVICE) -> str:
    lines = [f"Triton path (`{PATH}`) against its targets on the {DEVICES[device].name}, by the model: the fastest "
             f"workspace within <= {TIME_TARGET_X_FLOOR}x the GEMM floor and <= {MEMORY_TARGET_X_CCE}x Cut "
             "Cross-Entropy's peak extra memory.", "", "| shape | scenario | workspace | x floor | x CCE's memory |",
             "|---|---|---:|---:|---:|"]
    for shape in TARGET_SHAPES:
        for scenario in ("token-level", "sequence-level", "frozen head"):
            p = target_problem(shape, scenario)
            workspace = workspace_within_targets(p, device)
            if workspace is None:
                lines.append(f"| {shape} | {scenario} | none | - | - |")
                continue
            time, memory = within_targets(replace(p, workspace_bytes=workspace), device)
            lines.append(f"| {shape} | {scenario} | {workspace // MIB} MiB | {time:.2f}x | {memory:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    del argv
    sys.stdout.write(report())
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(lambda: main(sys.argv[1:]), "python -m benchmarks.model.triton_targets"))
