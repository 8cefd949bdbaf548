"""The one GPU command: `pytest -m gpu`, then the GPU benchmark set beside the bare GEMMs and the roofline model,
in parts that each fit a command stopped after 10 minutes. Run the same command line until it says that
everything is done:

    python -m benchmarks.gpu --out OUT_DIR [--resume EARLIER_OUT_DIR] [--budget-s 540] [--skip-tests]

Each invocation is one part of at most --budget-s seconds, taking the next items in order while their modelled
time fits (benchmarks/gpu/plan.py): a correctness smoke first (every backend against float64 on the GPU, at most
2 minutes, recorded before anything else), then the headline cases (S1's token-level loss and no-grad log-probs:
the floor, auto, gemm, TRL, Liger, CCE), then `pytest -m gpu` (where its whole timeout fits a part), then the
rest. Every finished
item is appended to OUT_DIR/progress.jsonl at once, and OUT_DIR/<gpu>.json (pytest-benchmark's layout, what
`python -m benchmarks.suite.report` reads) and <gpu>.md (the report) are regenerated after each, so a run killed
mid-way keeps what it measured; the next invocation skips what is done. A case that was in flight when its
process died is retried once after the others, and recorded as FAILED if it dies again. Where the out folder
starts empty every time (a lent GPU machine's $OUT), --resume names a copy of the earlier out folder to
continue from. Exit code: 0 everything is done, 1 everything is done and something failed (a GPU test, a
case), 3 more parts to run, 2 nothing could run (no GPU, bad arguments). liger-kernel, cut-cross-entropy
and the other peers of benchmarks.suite.paths are benchmarked when importable and skipped with the reason when not.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import torch

from grpo_engine.cli_parser import CommandParser, doc_summary
from grpo_engine.cli_types import file_name, names_from, output_directory, positive_float
from grpo_engine.command_failure import run_tool

from ..model.roofline import predict_case_ms
from ..suite.cases import LOSS_CASES, flops
from ..suite.machine import cpu_name, package_version
from ..suite.inputs import BenchInputs, make_inputs
from ..suite.memory import gpu_peak_extra_bytes
from ..suite.paths import PathUnavailable, check_available, make_floor_step, make_step, valid_tokens
from ..suite.run import device_slug
from ..suite.runner import is_out_of_memory
from ..suite.shapes import BenchShape
from .plan import (GPU_PATHS, PART_BUDGET_S, SMOKE_TIMEOUT_S, TEST_TIMEOUT_S, TESTS_TIMEOUT_S, WARMUP_ROUNDS,
                   WRITE_MARGIN_S, GpuCase, Plan, by_priority, fits, is_headline, make_plan, rounds_for,
                   seconds_needed)
from .results import FAILED, Progress, ResultsDir, label

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NO_GPU_MESSAGE = ("python -m benchmarks.gpu needs a CUDA GPU, and torch.cuda.is_available() is False here. "
                  "Without one: `python -m benchmarks.model.roofline` prints the model's predictions, "
                  "`python -m benchmarks.suite.run` runs the CPU benchmarks.")
EXIT_DONE, EXIT_FAILED, EXIT_CANNOT_RUN, EXIT_MORE = 0, 1, 2, 3
MAX_STARTS = 2  # an item in flight when its process died this often is recorded as FAILED, not retried
MIN_CHECK_S = 60  # a GPU check does not start with less time than this left in the part


@dataclass(frozen=True)
class Check:
    """A GPU check: a command run beside the benchmarks, its output appended to the tests log. One that runs after
    the headline cases starts only where its whole timeout fits the part (else the next part starts with it)."""
    name: str
    command: tuple[str, ...]
    timeout_s: float
    after_headline: bool = False

    @property
    def id(self) -> str:
        return f"check::{self.name}"


SMOKE_TESTS = "tests/benchmarks/test_gpu_smoke.py"  # every backend at one mid-size shape against float64, on the GPU


def gpu_checks() -> tuple[Check, ...]:
    """The correctness smoke (before anything else) and the full GPU tests (after the headline cases)."""
    pytest = [sys.executable, "-m", "pytest", "-q", "-rs", "--tb=short", "-p", "no:cacheprovider"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        pytest.append(f"--timeout={TEST_TIMEOUT_S}")  # a hung test fails alone instead of costing the part
    return (Check("smoke", (*pytest, "-m", "gpu", SMOKE_TESTS), SMOKE_TIMEOUT_S),
            Check("pytest-gpu", (*pytest, "-m", "gpu", "tests/", f"--ignore={SMOKE_TESTS}"), TESTS_TIMEOUT_S,
                  after_headline=True))


def _summary_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    return next((line.strip("= ") for line in reversed(lines) if " in " in line and any(
        word in line for word in ("passed", "failed", "error", "skipped", "deselected"))), lines[-1] if lines else "")


def run_check(check: Check, timeout_s: float, log_path: str) -> dict:
    """Run one check in its own process group, its output streamed to the log; its outcome for the results."""
    started = time.monotonic()
    with open(log_path, "a") as log:
        log.write(f"$ {shlex.join(check.command)}   (timeout {timeout_s:.0f} s)\n")
        log.flush()
        offset = log.tell()
        process = subprocess.Popen(check.command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                   start_new_session=True)  # the checks name paths of the repository (tests/)
        try:
            code: Optional[int] = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # pytest and whatever it started
            process.wait()
            code = None
    with open(log_path) as log:
        log.seek(offset)
        output = log.read()
    summary = f"timed out after {timeout_s:.0f} s; last line: {_summary_line(output)}" if code is None \
        else _summary_line(output)
    print(output[-3000:], flush=True)
    return {"command": shlex.join(["python", *check.command[1:]]), "exit_code": code, "summary": summary,
            "seconds": round(time.monotonic() - started, 1)}


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
            "batch": shape.batch, "seq_len": shape.seq_len, "dtype": shape.dtype, "device": device.type,
            "flops": flops(case.operation, shape.tokens, shape.head.hidden, shape.head.vocab),
            "valid_tokens": valid, "peak_extra_bytes": peak,
            "rounds": len(times), "mean_entropy": inputs.mean_entropy,
            # the model's sequence rows (a sequence-level loss may run in waves of whole sequences): the report
            # predicts this run with them
            "sequence_rows": shape.seq_len,
            "predicted_ms": predict_case_ms(device_name, case.path, case.operation, case.case_name,
                                            shape.head.hidden, shape.head.vocab, shape.tokens, shape.dtype, valid,
                                            shape.seq_len)}
    return {"name": f"gpu::{case.id}", "group": f"{case.operation} | {case.case_name} | flat | {shape.id}",
            "stats": {"median": median_ms / 1e3, "min": min(times) / 1e3, "max": max(times) / 1e3,
                      "rounds": len(times)},
            "extra_info": {**info, "cuda_event_median_ms": median_ms} if device.type == "cuda" else info}


def _failure(case: GpuCase, error: Exception) -> tuple[str, str]:
    """(event, reason) of a case that raised: out of memory is a skip, anything else a failure."""
    if is_out_of_memory(error):
        return "skipped", f"{case.path}: out of memory at N={case.shape.tokens}"
    first_line = str(error).splitlines()[0][:200] if str(error) else ""
    return "failed", f"{case.path}: {FAILED}: {type(error).__name__}: {first_line}"


def _cuda_broken(device: torch.device) -> bool:
    """After an error: can this process still use the GPU? (an illegal access poisons the context for good)"""
    if device.type != "cuda":
        return False
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return False
    except Exception:  # noqa: BLE001 - whatever the driver raises, the answer is the same
        return True


class _ShapeInputs:
    """The current shape's inputs, rebuilt when the shape changes (the cases come grouped by shape)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.shape: Optional[BenchShape] = None
        self.inputs: Optional[BenchInputs] = None

    def get(self, shape: BenchShape) -> BenchInputs:
        if shape != self.shape:
            self.shape, self.inputs = None, None  # GPU-set inputs are gigabytes: free them before the next
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            # Timing and memory do not depend on the token values: uniform tokens spare sampling.
            self.inputs = make_inputs(shape, "flat", self.device, sample_from_policy=False)
            self.shape = shape
        return self.inputs


def _measure(case: GpuCase, inputs: _ShapeInputs, device: torch.device, device_name: str) -> dict:
    """The terminal event of one case: its result, or why it was skipped or failed."""
    try:
        record = run_case(case, inputs.get(case.shape), device, device_name)
    except PathUnavailable as reason:
        return {"event": "skipped", "id": case.id, "reason": f"{case.path}: {reason}"}
    except Exception as error:  # noqa: BLE001 - one broken case must not cost the other cases' results
        kind, reason = _failure(case, error)
        return {"event": kind, "id": case.id, "reason": reason}
    return {"event": "result", "id": case.id, "record": record}


def _case_line(event: dict) -> str:
    if event["event"] != "result":
        return f"{event['id']}: {event['reason']}"
    record = event["record"]
    predicted = record["extra_info"]["predicted_ms"]
    return f"{event['id']}: {record['stats']['median'] * 1e3:.2f} ms" + (f" (predicted {predicted:.2f})" if predicted
                                                                      else "")


Item = Union[Check, GpuCase]


@dataclass
class PartSummary:
    part: int
    recorded: list[str] = field(default_factory=list)  # ids finished in this part
    left: list[str] = field(default_factory=list)  # ids still to run after it
    stopped: str = "done"  # "done", "budget" (the next item does not fit), "cuda" (the GPU context broke)
    failures: list[str] = field(default_factory=list)  # everything failed so far, this part or before


def ordered_items(checks: tuple[Check, ...], plan: Plan) -> list[Item]:
    """The run's order: the checks that come first (the smoke), the headline cases, the checks after the headline
    (the full GPU tests), the other cases."""
    headline = [case for case in plan.cases if is_headline(case)]
    rest = [case for case in plan.cases if not is_headline(case)]
    return [*(c for c in checks if not c.after_headline), *headline, *(c for c in checks if c.after_headline), *rest]


def _pending(items: list[Item], state: Progress) -> list[Item]:
    """Unfinished items in order; those that were in flight when a process died go last (retried once)."""
    todo = [item for item in items if item.id not in state.finished]
    return sorted(todo, key=lambda item: state.starts[item.id] > 0)


def run_part(results: ResultsDir, command: str, meta: dict, checks: tuple[Check, ...], plan: Plan, budget_s: float,
             device: torch.device, device_name: str, need: Callable[[GpuCase, bool], float] = seconds_needed,
             started_at: Optional[float] = None) -> PartSummary:
    """One invocation's part: record it, then run pending items while the budget lasts, each written at once."""
    started_at = time.monotonic() if started_at is None else started_at
    state = results.progress()
    summary = PartSummary(part=len(state.parts) + 1)
    results.append({"event": "part", "part": summary.part, "command": command, "meta": meta})

    items = ordered_items(checks, plan)
    planned = [item.id for item in items]

    def record(event: dict) -> None:
        results.append(event)
        summary.recorded.append(event["id"])
        results.write_report(planned)

    for item, starts in state.starts.items():
        if starts >= MAX_STARTS:
            record({"event": "failed", "id": item, "reason": f"{label(item)}: {FAILED}: its process died while it "
                    f"ran, {starts} times (killed at the command's time limit, hung, or crashed); not retried"})
    for case, reason in plan.skipped:
        if case.id not in state.finished:
            record({"event": "skipped", "id": case.id, "reason": reason})
    state = results.progress()
    inputs = _ShapeInputs(device)
    ran = False  # whether this part has run an item yet
    for item in _pending(items, state):
        elapsed = time.monotonic() - started_at
        if isinstance(item, Check):
            timeout = min(item.timeout_s, budget_s - WRITE_MARGIN_S - elapsed)
            if timeout < MIN_CHECK_S or (item.after_headline and ran and timeout < item.timeout_s):
                summary.stopped = "budget"
                break
            results.append({"event": "started", "id": item.id})
            record({"event": "check", "id": item.id, "outcome": run_check(item, timeout, results.tests_log_path)})
            ran = True
            continue
        case = item
        try:
            if case.path != "floor":
                check_available(case.path, case.operation, case.shape, device)
        except PathUnavailable as reason:
            record({"event": "skipped", "id": case.id, "reason": f"{case.path}: {reason}"})
            continue
        if not fits(elapsed, need(case, case.shape != inputs.shape), budget_s):
            summary.stopped = "budget"
            break
        results.append({"event": "started", "id": case.id})
        ran = True
        event = _measure(case, inputs, device, device_name)
        record(event)
        print(_case_line(event), flush=True)
        if event["event"] != "result" and _cuda_broken(device):
            summary.stopped = "cuda"
            break
    results.write_report(planned)
    state = results.progress()
    summary.left = [item.id for item in _pending(items, state)]
    summary.failures = state.failures()
    return summary


# ---- what the results record of the machine and the code ------------------------------------------

def _driver_version() -> Optional[str]:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
        return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def _git(*args: str) -> Optional[str]:
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO_ROOT, timeout=20)
        return done.stdout.strip() if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def source_digest(root: str = REPO_ROOT) -> str:
    """sha256 (12 hex digits) of the package's, benchmarks' and tests' Python sources: names the code where a
    copied tree has no .git (compare with this function's value at a commit)."""
    digest = hashlib.sha256()
    for folder in ("grpo_kernels", "benchmarks", "tests"):
        for directory, subdirs, files in sorted(os.walk(os.path.join(root, folder))):
            subdirs.sort()
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(directory, name)
                digest.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as f:
                    digest.update(f.read() + b"\0")
    return digest.hexdigest()[:12]


def metadata(device: torch.device, device_name: str, commit: Optional[str] = None) -> dict:
    """Device, versions and code of this invocation (the report's header reads the first keys)."""
    cuda = device.type == "cuda"
    properties = torch.cuda.get_device_properties(device) if cuda else None
    commit = commit or _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"device": device_name, "device_type": device.type, "cpu": cpu_name(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "triton": package_version("triton"),
            "cuda": torch.version.cuda, "driver": _driver_version() if cuda else None,
            "gpu": {"capability": f"{properties.major}.{properties.minor}", "sms": properties.multi_processor_count,
                    "memory_bytes": properties.total_memory} if properties else None,
            "transformers": package_version("transformers"), "accelerate": package_version("accelerate"),
            "liger_kernel": package_version("liger-kernel"), "cut_cross_entropy": package_version("cut-cross-entropy"),
            "trl": package_version("trl"), "numpy": package_version("numpy"), "grpo_kernels": package_version("grpo-kernels"),
            "python": platform.python_version(), "bench_set": "gpu command", "paths": list(by_priority(GPU_PATHS)),
            "commit": commit, "dirty": None if status is None else bool(status), "source_digest": source_digest(),
            "load_average_1_5_15m": [round(x, 2) for x in os.getloadavg()]}


def status_line(summary: PartSummary, results: ResultsDir) -> str:
    where = f"results: {results.json_path} and {os.path.basename(results.md_path)}"
    if summary.left:
        why = {"cuda": "the GPU context broke (a fresh process continues)",
               "budget": "this part's budget is spent", "done": "some items are unfinished"}[summary.stopped]
        return (f"benchmarks.gpu part {summary.part}: {len(summary.recorded)} recorded; {why}; {len(summary.left)} "
                f"left: run the same command again ({where})")
    failed = f"; {len(summary.failures)} failed:\n  " + "\n  ".join(summary.failures) if summary.failures else ""
    return f"benchmarks.gpu: everything is done after part {summary.part} ({where}){failed}"


def main(argv: Optional[list[str]] = None) -> int:
    started_at = time.monotonic()
    argv = sys.argv[1:] if argv is None else argv
    parser = CommandParser(prog="python -m benchmarks.gpu", description=doc_summary(__doc__, first_line=True))
    parser.add_argument("--out", required=True, type=output_directory, help="the run's directory: continued when it holds progress")
    parser.add_argument("--resume", help="an earlier run's directory to continue from when --out has no progress yet "
                                         "(e.g. the carried copy of a GPU machine's $OUT/...); missing or empty: a new run")
    parser.add_argument("--budget-s", type=positive_float("seconds"), default=PART_BUDGET_S,
                        help=f"this part's wall-clock budget (default {PART_BUDGET_S}: 9 minutes)")
    parser.add_argument("--skip-tests", action="store_true",
                        help="do not run the correctness smoke nor `pytest -m gpu` in this invocation")
    parser.add_argument("--name", type=file_name,
                        help="results file name (default: the GPU's slug, e.g. h100-80gb-hbm3)")
    parser.add_argument("--paths", type=names_from(GPU_PATHS, "paths"), default=",".join(GPU_PATHS),
                        help="comma-separated paths to benchmark, the floor always beside them (default: every one: "
                             + ",".join(GPU_PATHS) + ")")
    parser.add_argument("--commit", help="the git commit of this tree, for a copy without .git "
                                         "(default: git rev-parse HEAD)")
    args = parser.parse_args(argv)
    paths = args.paths
    if not torch.cuda.is_available():
        print(NO_GPU_MESSAGE, file=sys.stderr)
        return EXIT_CANNOT_RUN
    results = ResultsDir(os.path.abspath(args.out), args.name or device_slug())
    device_name = torch.cuda.get_device_name(0)
    free, _total = torch.cuda.mem_get_info()
    try:
        plan = make_plan(paths, free, args.budget_s)
    except ValueError as error:
        parser.error(str(error))
    print(f"benchmarks.gpu: {results.open(os.path.abspath(args.resume) if args.resume else None)}", flush=True)
    earlier = results.progress().parts
    if earlier and earlier[-1]["meta"].get("device") != device_name:
        print(f"--out {args.out} holds a run on {earlier[-1]['meta'].get('device')}; this is {device_name}: name "
              f"another --out", file=sys.stderr)
        return EXIT_CANNOT_RUN
    command = shlex.join(["python", "-m", "benchmarks.gpu", *argv])
    summary = run_part(results, command, metadata(torch.device("cuda"), device_name, args.commit),
                       () if args.skip_tests else gpu_checks(), plan, args.budget_s, torch.device("cuda"),
                       device_name, started_at=started_at)
    print(status_line(summary, results), flush=True)
    if summary.left:
        return EXIT_MORE
    return EXIT_FAILED if summary.failures else EXIT_DONE


if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m benchmarks.gpu.command"))
