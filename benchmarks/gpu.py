"""The one GPU command: `pytest -m gpu`, then the GPU benchmark set beside the bare GEMMs and the roofline model.

    python -m benchmarks.gpu                      # one H100 / H200, about 20 minutes at most, no network
    python -m benchmarks.gpu --skip-tests --budget-s 600

Writes benchmarks/results/<gpu>.json (pytest-benchmark's layout, so `python -m benchmarks.report` reads it)
and <gpu>.md (the report: every case with its predicted time and measured / predicted). liger-kernel and
cut-cross-entropy are used when installed (e.g. from wheels) and skipped with the reason when not.
What runs, and in what memory and time, is benchmarks/gpu_plan.py.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from typing import Optional

import torch

from . import report
from .conftest import _cpu_name, _version
from .gpu_plan import (TESTS_BUDGET_S, TIME_SAFETY, TOTAL_BUDGET_S, WARMUP_ROUNDS, WRITE_MARGIN_S, GpuCase,
                       case_seconds, make_plan, rounds_for)
from .inputs import make_inputs
from .memory import gpu_peak_extra_bytes
from .cases import LOSS_CASES, flops
from .paths import PATHS, PathUnavailable, check_available, make_floor_step, make_step, valid_tokens
from .roofline import predict_case_ms
from .runner import is_out_of_memory
from .run import RESULTS_DIR, device_slug

FAILED = "FAILED"  # marks a case that raised (not a skip): the command then exits 1
NO_GPU_MESSAGE = ("python -m benchmarks.gpu needs a CUDA GPU, and torch.cuda.is_available() is False here. "
                  "Without one: `python -m benchmarks.roofline` prints the model's predictions, "
                  "`python -m benchmarks.run` runs the CPU benchmarks.")


def run_gpu_tests(timeout_s: float) -> dict:
    """`pytest -m gpu` over the test suite, in a subprocess; its summary line and exit code."""
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/", "-q", "-rs", "-p", "no:cacheprovider"]
    started = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        output, code = str(expired.stdout or "") + f"\ntimed out after {timeout_s:.0f} s", None
    lines = [line for line in output.splitlines() if line.strip()]
    summary = next((line.strip("= ") for line in reversed(lines) if " in " in line and ("passed" in line
                    or "failed" in line or "error" in line or "skipped" in line)), lines[-1] if lines else "")
    print(output[-3000:], flush=True)
    return {"command": "python -m " + " ".join(command[2:]), "exit_code": code,
            "summary": summary, "seconds": round(time.monotonic() - started, 1)}


def _time_ms(step, rounds: int, device: torch.device) -> list[float]:
    """Per-round milliseconds after the warm-up: CUDA events on a GPU, the wall clock elsewhere (tests)."""
    for _ in range(WARMUP_ROUNDS):
        step()
    times = []
    for _ in range(rounds):
        if device.type != "cuda":
            start_s = time.perf_counter()
            step()
            times.append((time.perf_counter() - start_s) * 1e3)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = step()
        end.record()
        torch.cuda.synchronize()
        del result
        times.append(start.elapsed_time(end))
    return times


def run_case(case: GpuCase, inputs, device: torch.device, device_name: str) -> dict:
    """Time and measure one case; a pytest-benchmark-shaped record. Raises PathUnavailable or OOM errors."""
    shape = case.shape
    if case.path == "floor":
        step = make_floor_step(case.operation, inputs)
    else:
        check_available(case.path, case.operation, shape, device)
        step = make_step(case.path, case.operation, inputs, LOSS_CASES[case.case_name])
    times = _time_ms(step, rounds_for(case), device)
    peak = gpu_peak_extra_bytes(step) if device.type == "cuda" else None
    median_ms = statistics.median(times)
    valid = valid_tokens(inputs, case.case_name)
    info = {"path": case.path, "operation": case.operation, "config": case.case_name, "regime": "flat",
            "head": shape.head.name, "hidden": shape.head.hidden, "vocab": shape.head.vocab, "tokens": shape.tokens,
            "batch": shape.batch, "seq_len": shape.seq_len, "dtype": shape.dtype, "device": "cuda",
            "flops": flops(case.operation, shape.tokens, shape.head.hidden, shape.head.vocab),
            "valid_tokens": valid, "peak_extra_bytes": peak,
            "rounds": len(times), "mean_entropy": inputs.mean_entropy,
            "predicted_ms": predict_case_ms(device_name, case.path, case.operation, case.case_name,
                                            shape.head.hidden, shape.head.vocab, shape.tokens, shape.dtype, valid)}
    return {"name": f"gpu::{case.id}", "group": f"{case.operation} | {case.case_name} | flat | {shape.id}",
            "stats": {"median": median_ms / 1e3, "min": min(times) / 1e3, "max": max(times) / 1e3,
                      "rounds": len(times)},
            "extra_info": {**info, "cuda_event_median_ms": median_ms} if device.type == "cuda" else info}


def run_benchmarks(cases: list[GpuCase], later: list[GpuCase], budget_s: float, device: torch.device,
                   device_name: str) -> tuple[list[dict], list[dict]]:
    """The planned cases in order, then the cases the plan expected not to fit, while the budget lasts."""
    started = time.monotonic()
    records, skipped = [], []
    inputs, inputs_shape = None, None
    for case in [*cases, *later]:
        left = budget_s - (time.monotonic() - started)
        # a planned case starts while any time is left; a later one only if its modelled time fits
        if left <= (case_seconds(case) / TIME_SAFETY if case in later else 0.0):
            skipped.append({"nodeid": f"gpu::{case.id}", "reason": f"{case.path}: the GPU command's "
                                                                     f"{budget_s:.0f} s benchmark budget is spent"})
            continue
        if case.shape != inputs_shape:
            inputs = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
            # Timing and memory do not depend on the token values: uniform tokens spare sampling.
            inputs, inputs_shape = make_inputs(case.shape, "flat", device, sample_from_policy=False), case.shape
        try:
            records.append(run_case(case, inputs, device, device_name))
            predicted = records[-1]["extra_info"]["predicted_ms"]
            print(f"{case.id}: {records[-1]['stats']['median'] * 1e3:.2f} ms"
                  + (f" (predicted {predicted:.2f})" if predicted else ""), flush=True)
        except PathUnavailable as reason:
            skipped.append({"nodeid": f"gpu::{case.id}", "reason": f"{case.path}: {reason}"})
        except Exception as error:  # noqa: BLE001 - one broken case must not cost the other cases' results
            what = (f"out of memory at N={case.shape.tokens}" if is_out_of_memory(error)
                    else f"{FAILED}: {type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}")
            skipped.append({"nodeid": f"gpu::{case.id}", "reason": f"{case.path}: {what}"})
            print(f"{case.id}: {what}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return records, skipped


def metadata(device_name: str, device_type: str, command: str, gpu_tests: Optional[dict]) -> dict:
    return {"device": device_name, "device_type": device_type, "cpu": _cpu_name(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "triton": _version("triton"),
            "cuda": torch.version.cuda, "liger_kernel": _version("liger-kernel"),
            "cut_cross_entropy": _version("cut-cross-entropy"), "grpo_kernels": _version("grpo-kernels"),
            "python": platform.python_version(), "bench_set": "gpu command", "command_line": command,
            "load_average_1_5_15m": [round(x, 2) for x in os.getloadavg()], "gpu_tests": gpu_tests}


def write_results(json_path: str, meta: dict, records: list[dict], skipped: list[dict]) -> int:
    """The JSON (pytest-benchmark's layout) and, beside it, the markdown report made from it."""
    data = {"machine_info": {"grpo_bench": meta}, "commit_info": {"id": _commit()},
            "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(), "benchmarks": records,
            "skipped": skipped}
    with open(json_path, "w") as f:
        json.dump(data, f, indent=1)
    return report.main([json_path, "--out", os.path.splitext(json_path)[0] + ".md", "--no-plots"])


def _commit() -> Optional[str]:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
    except OSError:
        return None


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=TOTAL_BUDGET_S, help="wall-clock budget of the command")
    parser.add_argument("--skip-tests", action="store_true", help="do not run `pytest -m gpu` first")
    parser.add_argument("--name", help="results file name (default: the GPU's slug, e.g. h100-80gb-hbm3)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_GPU_MESSAGE, file=sys.stderr)
        return 2
    started = time.monotonic()
    command = "python -m benchmarks.gpu" + "".join(f" {shlex.quote(a)}" for a in (argv if argv is not None
                                                                                   else sys.argv[1:]))
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.chdir(repo_root)
    free, _total = torch.cuda.mem_get_info()
    try:
        plan = make_plan(PATHS, free, args.budget_s, run_tests=not args.skip_tests)
    except ValueError as error:
        parser.error(str(error))
    gpu_tests = None if args.skip_tests else run_gpu_tests(TESTS_BUDGET_S)
    budget = args.budget_s - (time.monotonic() - started) - WRITE_MARGIN_S  # what the tests left
    records, skipped = run_benchmarks(plan.cases, [case for case, _ in plan.over_budget], budget,
                                      torch.device("cuda"), torch.cuda.get_device_name(0))
    skipped += [{"nodeid": f"gpu::{case.id}", "reason": reason} for case, reason in plan.skipped]
    name = args.name or device_slug()
    os.makedirs(RESULTS_DIR, exist_ok=True)
    json_path = os.path.relpath(os.path.join(RESULTS_DIR, name + ".json"), repo_root)
    meta = metadata(torch.cuda.get_device_name(0), "cuda", command, gpu_tests)
    code = write_results(json_path, meta, records, skipped)
    print(f"wrote {json_path} and its .md in {time.monotonic() - started:.0f} s", file=sys.stderr)
    failed_tests = gpu_tests is not None and gpu_tests["exit_code"] != 0
    failed_cases = [s for s in skipped if f": {FAILED}: " in s["reason"]]
    return 1 if failed_tests or failed_cases else code


if __name__ == "__main__":
    sys.exit(main())
