"""Fit the roofline model's measured rates to a GPU run's results, one rate from the cases that depend on it.

    python -m benchmarks.model.calibrate benchmarks/results/h200.json

Three of the model's rates are not datasheet numbers but what kernels achieve, so a GPU run measures them:
- `tensor_flops`, cuBLAS's large-GEMM rate: from the bare-GEMM floor cases (nothing but cuBLAS GEMMs);
- `triton_tensor_flops`, the rate of a Triton kernel's tl.dot tiles: from Cut Cross-Entropy's no-grad
  log-probs (one Triton kernel, compute-bound by the model);
- `row_pass_bytes_per_s`, the bandwidth of a pass over long logits rows (a Triton program per row walking
  the vocabulary): from every gemm and TRL case (cuBLAS GEMMs and row passes) whose code the model describes
  (`modelled`), with the two rates above fitted;
- `l2_reduction_bytes_per_s`, the rate of float32 atomics resolved in L2: from Cut Cross-Entropy's loss cases (its
  backward adds dE and dC by atomics), with the L2 read rate fixed.
The L2 read rate (`l2_bytes_per_s`, 7.8 TB/s) is a lower bound from the second H200 run's Triton forward
(benchmarks/results/h200-second-run/triton-check.log: 159 GB of tile loads in 20.48 ms, compute-bound), not in this
file's results: the triton cases here are the first run's, whose kernels (a program per 32-token block re-reading W
from L2) have since been replaced, so the model no longer describes them and they are left out of every fit.
Each is fitted in that order by a one-dimensional search that minimises the squared log error of its cases. The
table after it shows measured / predicted per path and operation with the fitted rates, every case included,
so what the three rates do not explain stays visible.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import replace
from typing import Callable, Optional

from grpo_kernels.cost_model import DEVICES, DeviceRates, device_key

from ..suite.report import Result, Run, load_run
from .roofline import case_problem, estimate

# (rate, the cases it is fitted on: in words, and as a test of a result's path and operation)
FITS: tuple[tuple[str, str, Callable[[Result], bool]], ...] = (
    ("tensor_flops", "floor", lambda r: r.path == "floor"),
    ("triton_tensor_flops", "cce log-probs", lambda r: r.path == "cce" and r.operation == "logprobs"),
    ("row_pass_bytes_per_s", "gemm and trl, every case", lambda r: r.path in ("gemm", "trl")),
    ("l2_reduction_bytes_per_s", "cce loss (its backward's float32 atomics)",
     lambda r: r.path == "cce" and r.operation == "loss"),
)
# Runs whose GEMM-path training cases added the later dW waves with the Triton GEMM of kernels/accumulate_mm.py
# (21.3 ms at S1 where cuBLAS takes 8-9), since replaced by cuBLAS adding into the float32 accumulator: the model
# describes the new code, so those cases cannot calibrate it.
TRITON_DW_RUNS = frozenset({"25ba73ea4f21436d5ebd61aa524e8ab08157ba20"})


def modelled(run: Run, result: Result) -> bool:
    """Whether the model describes the code that measured `result`."""
    trained_head = result.operation == "loss" and result.config != "dapo_kl_frozen"
    return not (result.path in ("gemm", "auto") and trained_head and run.meta.get("commit") in TRITON_DW_RUNS)


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


def calibrate(run: Run) -> tuple[DeviceRates, DeviceRates]:
    """(the model's rates for the run's GPU, the rates fitted to the run)."""
    key = device_key(run.meta.get("device", ""))
    if key is None:
        raise ValueError(f"the model has no rates for {run.meta.get('device', '?')!r}: nothing to calibrate")
    before = fitted = DEVICES[key]
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


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    for name, source, _ in FITS:
        unit = 1e12
        lines.append(f"| `{name}` | {getattr(before, name) / unit:.1f}e12 | {getattr(fitted, name) / unit:.1f}e12 | "
                     f"{source} |")
    lines += ["", *error_lines(run, before, "With the model's rates"), "",
              *error_lines(run, fitted, "With the fitted rates")]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
