"""Fit the roofline model's measured rates to a GPU run's results, one rate from the cases that depend on it.

    python -m benchmarks.model.calibrate benchmarks/results/h200.json

The model's rates that are not datasheet numbers but what kernels achieve, and the GPU runs that measure them:
- `tensor_flops`, cuBLAS's large-GEMM rate: from the bare-GEMM floor cases (nothing but cuBLAS GEMMs);
- `triton_tensor_flops`, the rate of a Triton kernel's tl.dot tiles: from Cut Cross-Entropy's no-grad
  log-probs (one Triton kernel, compute-bound by the model);
- `l2_reduction_bytes_per_s`, the rate of float32 atomics resolved in L2: from Cut Cross-Entropy's loss cases (its
  backward adds dE and dC by atomics), with the L2 read rate fixed;
- `row_program_bytes_per_s`, what one program of this library's row kernels (kernels/rows.py, a program per row)
  loads per second, and `row_pass_bytes_per_s`, what TRL's row kernels load per second: from the second H200 run's
  kernel profile (benchmarks/results/h200-second-run/profile-s1.md, S1: the kernels' own times, so no other
  rate enters), as the geometric mean over the kernels of (bytes loaded / time), per program for this library's.
The first four are fitted to the first run's results (a one-dimensional search per rate, in that order, minimising
the squared log error of its cases). The L2 read rate (`l2_bytes_per_s`, 7.8 TB/s) is a lower bound from the second
run's Triton forward (benchmarks/results/h200-second-run/triton-check.log: 159 GB of tile loads in 20.48 ms,
compute-bound). The table after them shows every case measured / predicted with the fitted rates, and beside each
case off by more than a quarter the reason (`reason`): code since replaced, or what the model leaves out.
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import replace
from typing import Callable, Optional

from grpo_engine.cli_parser import CommandParser, doc_summary
from grpo_engine.command_failure import run_tool
from grpo_kernels.cost_model import DEVICES, DeviceRates, device_key

from ..suite.report import Result, Run, load_run
from .roofline import case_problem, estimate

# (rate, the cases it is fitted on: in words, and as a test of a result's path and operation)
FITS: tuple[tuple[str, str, Callable[[Result], bool]], ...] = (
    ("tensor_flops", "floor", lambda r: r.path == "floor"),
    ("triton_tensor_flops", "cce log-probs", lambda r: r.path == "cce" and r.operation == "logprobs"),
    ("l2_reduction_bytes_per_s", "cce loss (its backward's float32 atomics)",
     lambda r: r.path == "cce" and r.operation == "loss"),
)
# Runs whose GEMM-path training cases added the later dW waves with the Triton GEMM of kernels/accumulate_mm.py
# (21.3 ms at S1 where cuBLAS takes 8-9), since replaced by cuBLAS adding into the float32 accumulator: the model
# describes the new code, so those cases cannot calibrate it.
TRITON_DW_RUNS = frozenset({"25ba73ea4f21436d5ebd61aa524e8ab08157ba20"})


# The second run's kernel profile at S1 (V 151936): (section, kernel, rows through it per step, bytes loaded per
# logit, whose): row kernels' times in isolation. The gemm path's log-probs run every position (8192 rows); its loss
# and TRL's drop padding (6004 valid rows of 8192); TRL's log-probs take no mask (8192).
SECOND_RUN_PROFILE = "benchmarks/results/h200-second-run/profile-s1.md"
PROFILE_VOCAB = 151936
ROW_KERNELS = (
    ("logprobs | gemm", "_row_stats_kernel", 8192, 4, "library"),
    ("loss | gemm", "_row_stats_kernel", 6004, 4, "library"),
    ("loss | gemm", "_row_grad_kernel", 6004, 4, "library"),
    ("logprobs | trl", "_forward_kernel", 8192, 2, "trl"),
    ("loss | trl", "_forward_kernel", 6004, 2, "trl"),
    ("loss | trl", "_backward_kernel", 6004, 2, "trl"),
)


def profile_kernels(text: str) -> dict[tuple[str, str], tuple[float, int]]:
    """(section, kernel) -> (ms per step, calls per step) from a benchmarks.gpu.profile report."""
    found, section = {}, ""
    for line in text.splitlines():
        if line.startswith("### "):
            section = line[4:].strip()
        elif line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            found[(section, cells[0].strip("`"))] = (float(cells[1]), int(cells[2]))
    return found


def row_kernel_rates(text: str) -> dict[str, float]:
    """The two row-kernel rates from a profile at S1: `row_program_bytes_per_s` (per program of this library's
    row kernels, a program per row of a launch) and `row_pass_bytes_per_s` (TRL's)."""
    kernels = profile_kernels(text)
    per_program, trl = [], []
    for section, kernel, rows, itemsize, whose in ROW_KERNELS:
        ms, calls = kernels[(section, kernel)]
        rate = rows * PROFILE_VOCAB * itemsize / (ms * 1e-3)
        if whose == "library":
            per_program.append(rate / (rows / calls))
        else:
            trl.append(rate)
    return {"row_program_bytes_per_s": statistics.geometric_mean(per_program),
            "row_pass_bytes_per_s": statistics.geometric_mean(trl)}


def modelled(run: Run, result: Result) -> bool:
    """Whether the model describes the code that measured `result`."""
    trained_head = result.operation == "loss" and result.config != "dapo_kl_frozen"
    return not (result.path in ("gemm", "auto") and trained_head and run.meta.get("commit") in TRITON_DW_RUNS)


# Why a case is predicted no better than within a quarter: (the case, the reason), the first that applies.
REASONS: tuple[tuple[Callable[[Run, Result], bool], str], ...] = (
    (lambda run, r: not modelled(run, r),
     "ran the dW waves through a Triton GEMM (21.3 ms at S1 in the second run's profile where cuBLAS takes 8-9), "
     "since replaced by cuBLAS adding into the accumulator"),
    (lambda run, r: r.path in ("gemm", "auto") and r.operation == "logprobs"
     and run.meta.get("commit") in TRITON_DW_RUNS,
     "ran input checks of four elementwise passes over hidden and the head (2.4 ms at S1 in the second run's "
     "profile), since one reduction each, and a statistics pass of one program per row, since segmented"),
    (lambda run, r: r.path == "triton" and run.meta.get("commit") in TRITON_DW_RUNS,
     "the first run's Triton kernels (a program per 32-token block re-reading W), since replaced"),
    (lambda run, r: r.path == "torch",
     "the torch backend's eager chunk loop: thousands of small ops bound by the host's dispatch, where the model "
     "charges 4 us a launch (a path auto does not take)"),
    (lambda run, r: r.path == "reference",
     "the model counts each elementwise op of the eager formula as its own pass over [N, V]; torch's fused "
     "log_softmax forward and backward make fewer (a path auto does not take)"),
    (lambda run, r: r.path == "liger",
     "torch.compile's generated chunk kernels, not modelled op by op (a path auto does not take)"),
    (lambda run, r: r.path == "cce",
     "Cut Cross-Entropy's autotuned tiles at H = 2048 not modelled (one 256 x 256 block at every shape)"),
)


def reason(run: Run, result: Result) -> Optional[str]:
    """Why the model is not held to a quarter on this case; None where it is."""
    return next((why for applies, why in REASONS if applies(run, result)), None)


def predicted_ms(result: Result, rates: DeviceRates) -> Optional[float]:
    p = case_problem(result.operation, result.config, result.hidden, result.vocab, result.tokens, result.dtype,
                     result.extra.get("valid_tokens"))
    if p is None:
        return None
    try:
        return estimate(result.path, p, rates).seconds(rates) * 1e3
    except KeyError:  # a path the model does not cover
        return None


def log_error(results: list[Result], rates: DeviceRates) -> float:
    errors = [math.log(r.median_ms / ms) ** 2 for r in results if (ms := predicted_ms(r, rates))]
    return sum(errors) / len(errors) if errors else math.inf


def fit_rate(name: str, results: list[Result], rates: DeviceRates) -> float:
    """The value of `name` in [0.1, 2] x its current value minimising the cases' squared log error (golden-section
    search on the logarithm: the error is unimodal in one rate, each phase's time being a max of terms)."""
    low, high = math.log(getattr(rates, name) * 0.1), math.log(getattr(rates, name) * 2.0)
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        if log_error(results, replace(rates, **{name: math.exp(a)})) <= log_error(
                results, replace(rates, **{name: math.exp(b)})):
            high = b
        else:
            low = a
    return math.exp((low + high) / 2)


def calibrate(run: Run, profile_path: str = SECOND_RUN_PROFILE) -> tuple[DeviceRates, DeviceRates]:
    """(the model's rates for the run's GPU, the rates fitted to the run and to the kernel profile)."""
    key = device_key(run.meta.get("device", ""))
    if key is None:
        raise ValueError(f"the model has no rates for {run.meta.get('device', '?')!r}: nothing to calibrate")
    before = DEVICES[key]
    with open(profile_path) as profile:
        fitted = replace(before, **row_kernel_rates(profile.read()))
    for name, _, selects in FITS:
        cases = [r for r in run.results if selects(r) and r.regime in ("flat", "any") and modelled(run, r)]
        if cases:
            fitted = replace(fitted, **{name: fit_rate(name, cases, fitted)})
    return before, fitted


def error_lines(run: Run, rates: DeviceRates, title: str) -> list[str]:
    groups: dict[tuple[str, str], list[float]] = {}
    for r in run.results:
        ms = predicted_ms(r, rates)
        if ms:
            label = r.operation if r.operation == "logprobs" or r.path == "floor" else f"loss {r.config}"
            groups.setdefault((r.path, label), []).append(r.median_ms / ms)
    lines = [f"#### {title}", "", "| path | operation | cases | measured / predicted (median, range) |",
             "|---|---|---:|---|"]
    for (path, label), ratios in sorted(groups.items()):
        lines.append(f"| {path} | {label} | {len(ratios)} | {statistics.median(ratios):.2f}x "
                     f"({min(ratios):.2f}-{max(ratios):.2f}) |")
    return lines


def case_lines(run: Run, rates: DeviceRates) -> list[str]:
    """Every case: measured, predicted, their ratio, and beside a ratio outside [0.8, 1.25] the reason."""
    lines = ["| path | operation | shape | measured ms | predicted ms | measured / predicted | reason |",
             "|---|---|---|---:|---:|---:|---|"]
    for r in sorted(run.results, key=lambda r: (r.path, r.operation, r.config, r.head)):
        ms = predicted_ms(r, rates)
        if not ms or r.regime not in ("flat", "any"):
            continue
        ratio = r.median_ms / ms
        off = abs(math.log(ratio)) > math.log(1.25)
        label = r.operation if r.operation == "logprobs" or r.path == "floor" else f"loss {r.config}"
        lines.append(f"| {r.path} | {label} | {r.head} | {r.median_ms:.2f} | {ms:.2f} | {ratio:.2f}x | "
                     f"{(reason(run, r) or 'NOT EXPLAINED') if off else ''} |")
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    parser = CommandParser(prog="python -m benchmarks.model.calibrate",
                           description=doc_summary(__doc__, first_line=True))
    parser.add_argument("results", help="a GPU run's pytest-benchmark JSON (benchmarks/results/<gpu>.json)")
    args = parser.parse_args(argv)
    run = load_run(args.results)
    try:
        before, fitted = calibrate(run)
    except ValueError as error:
        print(f"calibrate: {error}", file=sys.stderr)
        return 2
    lines = [f"### Rates fitted to {args.results} ({run.meta.get('device', '?')})", "",
             "| rate | the model's | fitted | from |", "|---|---:|---:|---|"]
    sources = [(name, source) for name, source, _ in FITS] + [
        ("row_program_bytes_per_s", f"this library's row kernels, per program ({SECOND_RUN_PROFILE})"),
        ("row_pass_bytes_per_s", f"TRL's row kernels ({SECOND_RUN_PROFILE})")]
    for name, source in sources:
        unit = 1e12 if getattr(before, name) > 1e11 else 1e9
        exponent = "e12" if unit == 1e12 else "e9"
        lines.append(f"| `{name}` | {getattr(before, name) / unit:.2f}{exponent} | "
                     f"{getattr(fitted, name) / unit:.2f}{exponent} | {source} |")
    lines += ["", *error_lines(run, before, "With the model's rates"), "",
              *error_lines(run, fitted, "With the fitted rates"), "", "#### Every case, with the fitted rates", "",
              *case_lines(run, fitted)]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m benchmarks.model.calibrate"))
