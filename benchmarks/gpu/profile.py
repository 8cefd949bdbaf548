"""Where a path's time goes: each benchmarked step under torch.profiler, its kernels' device time per step.

    python -m benchmarks.gpu.profile [--shape S1[,S2]] [--paths gemm,trl,triton] [--operations logprobs,loss]
                                     [--steps 3] [--out FILE.md]

The GPU command (`python -m benchmarks.gpu`) gives one median per case; this splits a case into its kernels so
that the cost model's phases can be checked one by one (a GEMM's achieved rate, a row pass's bandwidth, launch
gaps). On a CPU it profiles CPU operators instead, at a small shape, which only shows that it runs.
"""

from __future__ import annotations

import collections
import os
import sys
from typing import Optional

import torch

from grpo_engine.cli_parser import CommandParser, doc_summary
from grpo_engine.cli_types import names_from, output_file, positive_int
from grpo_engine.command_failure import run_tool
from grpo_engine.state.atomic_file import FileWriteError, write_atomically

from ..suite.cases import LOSS_CASES, OPERATIONS
from ..suite.inputs import make_inputs
from ..suite.paths import PATHS, ROUTED, PathUnavailable, check_available, make_floor_step, make_step
from ..suite.shapes import TARGET_SHAPES, BenchShape, LMHead

CASE = "dapo_kl"  # the headline's loss configuration
TOP_KERNELS = 12


def kernel_times_ms(step, steps: int, device: torch.device) -> tuple[float, list[tuple[str, float, int]]]:
    """(step wall ms on the device's timeline, [(kernel or op name, ms per step, calls per step)]), longest first."""
    step()
    step()  # warm-up: compilation, autotuning, allocator
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    start, end = None, None
    # one cycle, every event kept (acc_events: torch 2.11 warns that a cycle's end clears them otherwise)
    with torch.profiler.profile(activities=activities, acc_events=True) as prof:
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        for _ in range(steps):
            step()
        if device.type == "cuda":
            end.record()
            torch.cuda.synchronize()
    totals: dict[str, float] = collections.defaultdict(float)
    calls: dict[str, int] = collections.defaultdict(int)
    for event in prof.events():
        on_device = event.device_type == torch.autograd.DeviceType.CUDA
        if device.type == "cuda" and not on_device:
            continue
        if device.type != "cuda" and event.cpu_parent is not None:
            continue  # CPU: top-level operators only, so nothing is counted twice
        duration_us = event.time_range.elapsed_us()
        totals[event.name] += duration_us / 1e3 / steps
        calls[event.name] += 1
    rows = sorted(((name, ms, round(calls[name] / steps)) for name, ms in totals.items()), key=lambda row: -row[1])
    wall = start.elapsed_time(end) / steps if start is not None else sum(ms for _, ms, _ in rows)
    return wall, rows


def profile_lines(shape: BenchShape, paths: list[str], operations: list[str], steps: int,
                  device: torch.device) -> list[str]:
    inputs = make_inputs(shape, "flat", device, sample_from_policy=False)
    lines = [f"## {shape.id} on {torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}, "
             f"torch {torch.__version__}", ""]
    for operation in operations:
        for path in paths:
            title = f"### {operation} | {path}"
            try:
                if path == "floor":
                    step = make_floor_step(operation, inputs)
                else:
                    check_available(path, operation, shape, device)
                    step = make_step(path, operation, inputs, LOSS_CASES[CASE])
                wall, rows = kernel_times_ms(step, steps, device)
            except PathUnavailable as reason:
                lines += [title, f"skipped: {reason}", ""]
                continue
            except Exception as error:  # noqa: BLE001 - one path's failure must not cost the others' profiles
                lines += [title, f"FAILED: {type(error).__name__}: {str(error).splitlines()[0][:200]}", ""]
                continue
            kernel_sum = sum(ms for _, ms, _ in rows)
            lines += [title, f"step {wall:.2f} ms; kernels {kernel_sum:.2f} ms (the rest is gaps between them)", "",
                      "| kernel | ms / step | calls / step | share |", "|---|---:|---:|---:|"]
            lines += [f"| `{name[:90]}` | {ms:.3f} | {count} | {ms / max(wall, 1e-9):.0%} |"
                      for name, ms, count in rows[:TOP_KERNELS]]
            lines.append("")
            del step
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    parser = CommandParser(prog="python -m benchmarks.gpu.profile", description=doc_summary(__doc__, first_line=True))
    parser.add_argument("--shape", default="S1", type=names_from(sorted(TARGET_SHAPES), "shapes"),
                        help=f"comma-separated, each one of {sorted(TARGET_SHAPES)} (CPU: a small stand-in); several "
                             "shapes run in one process, as the GPU command runs them")
    parser.add_argument("--paths", default="floor,gemm,trl,triton",
                        type=names_from(("floor", *ROUTED, *PATHS), "paths"))
    parser.add_argument("--operations", default="logprobs,loss", type=names_from(OPERATIONS, "operations"))
    parser.add_argument("--steps", type=positive_int, default=3)
    parser.add_argument("--out", type=output_file, help="also write the tables to this markdown file")
    args = parser.parse_args(argv)
    shape_names = args.shape
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lines = []
    for name in shape_names:
        shape = TARGET_SHAPES[name]
        if device.type != "cuda":  # the same code at a size a CPU runs in seconds
            shape = BenchShape(LMHead(f"{name}-cpu-standin", 64, 512), 2, 32, "float32")
        lines += profile_lines(shape, list(args.paths), list(args.operations), args.steps, device)
    text = "\n".join(lines)
    print(text)
    if args.out:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)  # as the type allowed
            write_atomically(args.out, text + "\n")
        except FileWriteError as exc:  # the tables are printed above; the earlier file is left whole
            print(f"python -m benchmarks.gpu.profile: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m benchmarks.gpu.profile"))
