"""Roofline model of every GRPO loss path on H100 / H200, from FLOPs and bytes counted from each algorithm.

    python -m benchmarks.model.roofline                   # the target shapes S1-S3 and the GPU benchmark shapes
    python -m benchmarks.model.roofline --device H200 --paths gemm floor --section targets --valid-fraction 0.5

The counts live in benchmarks/model/roofline_paths.py, the rates and the time rule in
benchmarks/model/roofline_model.py.
The report (benchmarks/suite/report.py) prints `predict_case_ms` beside every GPU measurement.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional

from grpo_engine.cli_parser import CommandParser, doc_summary
from grpo_engine.cli_types import positive_float
from grpo_engine.command_failure import run_tool
from grpo_kernels.backends import auto_candidates
from grpo_kernels.objective import is_token_level, on_policy_token_level, sequence_waves_apply
from grpo_kernels.routing import modelled_route

from ..suite.cases import LOSS_CASES
from ..suite.shapes import SHAPE_SETS, TARGET_SHAPE_MEANING, TARGET_SHAPES, BenchShape
from .roofline_model import DEVICES, GIB, DeviceRates, Estimate, Problem, device_key
from .roofline_paths import ALTERNATIVES, MODELS, auto

# Backends `auto` would take where the model puts them ahead once a GPU has measured their kernels (the Triton path
# on the Hopper recipe: its persistent kernel's rate is a published one until then); the report counts both ways.
PENDING_AUTO = ("triton_tma",)

# The project's targets at the target shapes: time over the bare GEMMs of the same shape (per scenario, below)
# and memory beyond the gradients.
PEAK_EXTRA_TARGET_BYTES = int(1.5 * GIB)


@dataclass(frozen=True)
class Scenario:
    name: str
    operation: str
    level: str = "token"
    frozen_head: bool = False
    target_x_floor: Optional[float] = None  # time over the floor of the same scenario


SCENARIOS: dict[str, Scenario] = {
    "token-level": Scenario("token-level", "loss", target_x_floor=1.15),
    "sequence-level": Scenario("sequence-level", "loss", level="sequence", target_x_floor=1.45),
    "frozen head": Scenario("frozen head", "loss", frozen_head=True),
    "no-grad log-probs": Scenario("no-grad log-probs", "logprobs", target_x_floor=1.10),
}


def problem(shape: BenchShape, scenario: Scenario, valid_fraction: float = 1.0) -> Problem:
    """The scenario at the shape; a sequence-level loss is GSPO's (separable by sequence: the GEMM path may take it
    in waves of whole sequences of the shape's length)."""
    return Problem(tokens=shape.tokens, hidden=shape.head.hidden, vocab=shape.head.vocab, dtype=shape.dtype,
                   operation=scenario.operation, level=scenario.level, frozen_head=scenario.frozen_head,
                   valid_fraction=valid_fraction,
                   sequence_rows=shape.seq_len if scenario.level == "sequence" else 0)


def estimate(path: str, p: Problem, rates: DeviceRates = DEVICES["H100"]) -> Estimate:
    """The model of `path` (a benchmarked path, "floor", "auto" or a design alternative) on problem `p`; `rates`
    matters to "auto" only (the route depends on the device)."""
    models = {**MODELS, **ALTERNATIVES}
    if path not in models:
        raise ValueError(f"path must be one of {sorted(models)}, got {path!r}")
    return auto(p, rates) if path == "auto" else models[path](p)


def x_floor(path: str, p: Problem, rates: DeviceRates) -> float:
    """Predicted time over the predicted bare GEMMs of the same problem (every position, no padding dropped)."""
    return estimate(path, p, rates).seconds(rates) / estimate("floor", p).seconds(rates)


# ---- the benchmark suite's cases ------------------------------------------------------------------

def case_problem(operation: str, config: str, hidden: int, vocab: int, tokens: int, dtype: str,
                 valid_tokens: Optional[int] = None, sequence_rows: int = 0) -> Optional[Problem]:
    """The Problem of one benchmark case (benchmarks.suite.cases names), or None when the model does not cover it
    (the logits-input operation, float32 inputs). `sequence_rows`: the case's sequence length where the GEMM path
    may take a sequence-level loss in waves of whole sequences (case_sequence_rows); 0 for runs measured before it
    could."""
    if operation not in ("loss", "logprobs") or dtype == "float32":
        return None
    level, frozen = "token", False
    if operation == "loss" and config in LOSS_CASES:
        case = LOSS_CASES[config]
        # the library's own decision (the suite's advantages are one per sequence, and it passes no rho)
        settings = on_policy_token_level(case.config, on_policy=not case.uses_old_logps, importance_ratio=False,
                                         advantages_per_sequence=True)
        level = "token" if is_token_level(settings) else "sequence"
        frozen = case.frozen_head
        sequence_rows = sequence_rows if level == "sequence" and sequence_waves_apply(settings) else 0
    else:
        sequence_rows = 0
    # the log-probs operation takes no mask: every position goes through the head
    valid = 1.0 if not valid_tokens or operation == "logprobs" else min(1.0, valid_tokens / tokens)
    return Problem(tokens=tokens, hidden=hidden, vocab=vocab, dtype=dtype, operation=operation, level=level,
                   frozen_head=frozen, valid_fraction=valid, sequence_rows=min(sequence_rows, tokens))


def predict_case_ms(device_name: str, path: str, operation: str, config: str, hidden: int, vocab: int,
                    tokens: int, dtype: str, valid_tokens: Optional[int] = None, sequence_rows: int = 0
                    ) -> Optional[float]:
    """Predicted milliseconds of a benchmark case on the named CUDA device; None where nothing is modelled."""
    key = device_key(device_name)
    p = case_problem(operation, config, hidden, vocab, tokens, dtype, valid_tokens, sequence_rows)
    if key is None or p is None or path not in MODELS:
        return None
    return estimate(path, p, DEVICES[key]).seconds(DEVICES[key]) * 1e3


# ---- the printed table -----------------------------------------------------------------------------

def _verdict(value: float, target: Optional[float]) -> str:
    if target is None:
        return "-"
    return "yes" if value <= target else "NO"


def _time_verdicts(ratios: list[float], devices: list[str], target: Optional[float]) -> str:
    """'H100 NO, H200 yes (<= 1.15x)': the predicted time meets the target on which device."""
    if target is None:
        return "-"
    return ", ".join(f"{d} {_verdict(r, target)}" for d, r in zip(devices, ratios)) + f" (<= {target}x)"


def targets_text() -> list[str]:
    """What the target shapes are and what each must meet, for the report's reader."""
    shapes = "; ".join(f"{label} ({TARGET_SHAPE_MEANING[label]}): N={s.tokens} H={s.head.hidden} V={s.head.vocab}"
                       for label, s in TARGET_SHAPES.items())
    token, sequence, logprobs = (SCENARIOS[name].target_x_floor
                                 for name in ("token-level", "sequence-level", "no-grad log-probs"))
    return [f"Shapes: {shapes}; bf16, dapo with beta 0.04 and old/reference log-probs given.",
            f"Targets: predicted time <= {token}x the bare GEMMs of the same shape (token-level loss), "
            f"<= {sequence}x (sequence-level), <= {logprobs}x (no-grad log-probs); peak extra memory "
            f"<= {PEAK_EXTRA_TARGET_BYTES / GIB:.2f} GiB. The time target column says, per device, whether the "
            f"prediction meets it; memory does not depend on the device."]


def table(shapes: list[tuple[str, BenchShape]], scenarios: list[Scenario], paths: list[str],
          devices: list[str], valid_fraction: float = 1.0) -> list[str]:
    head = ["shape", "scenario", "path", "GEMMs", "TFLOP", "HBM GB", "L2 GB", "peak extra GiB", "fp32 dW GiB",
            *(f"{d} ms" for d in devices), *(f"x floor {d}" for d in devices),
            *(f"x floor {d} overlapped" for d in devices), "time target", "memory target"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * (len(head) - 5) + "---|---|"]
    for label, shape in shapes:
        for scenario in scenarios:
            p = problem(shape, scenario, valid_fraction)
            for path in paths:
                est = estimate(path, p, DEVICES[devices[0]])  # counts: the first device's route for "auto"
                per_device = [estimate(path, p, DEVICES[d]) for d in devices]
                ratios = [x_floor(path, p, DEVICES[d]) for d in devices]
                target = None if path == "floor" else scenario.target_x_floor
                time_ok = _time_verdicts(ratios, devices, target)
                memory_ok = "-" if path == "floor" else _verdict(est.peak_extra_bytes, PEAK_EXTRA_TARGET_BYTES)
                lines.append("| " + " | ".join([
                    f"{label} N={shape.tokens} H={shape.head.hidden} V={shape.head.vocab}", scenario.name,
                    " / ".join(dict.fromkeys(e.path for e in per_device)) if path == "auto" else path,
                    str(est.gemms), f"{est.flops / 1e12:.1f}", f"{est.hbm_bytes / 1e9:.1f}",
                    f"{est.l2_bytes / 1e9:.1f}", f"{est.peak_extra_bytes / GIB:.2f}",
                    f"{est.fp32_weight_grad_bytes / GIB:.2f}",
                    *(f"{e.seconds(DEVICES[d]) * 1e3:,.1f}" for e, d in zip(per_device, devices)),
                    *(f"{r:.2f}x" for r in ratios),
                    *(f"{e.overlapped_seconds(DEVICES[d]) / estimate('floor', p).seconds(DEVICES[d]):.2f}x"
                      for e, d in zip(per_device, devices)), time_ok, memory_ok]) + " |")
    return lines


def rates_table(devices: list[str]) -> list[str]:
    lines = ["| device | bf16 TFLOP/s | fp32 TFLOP/s | HBM TB/s achievable (peak) | L2 MiB | SMs | source |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for key in devices:
        r = DEVICES[key]
        lines.append(f"| {r.name} | {r.tensor_flops / 1e12:.0f} | {r.fp32_flops / 1e12:.0f} | "
                     f"{r.hbm_bytes_per_s / 1e12:.2f} ({r.hbm_peak_bytes_per_s / 1e12:.2f}) | "
                     f"{r.l2_bytes / 2**20:.0f} | {r.sms} | {r.source} |")
    return lines


SECTIONS = ("all", "targets", "gpu-set")
# The operation x shape pairs `auto` is held against TRL's head on: a trained head's token-level loss, the
# sequence-level loss (GSPO), a frozen head's loss, and the no-grad log-probs (the old and reference passes of a
# GRPO step), at S1-S3: 12 pairs.
AGAINST_TRL = ("token-level", "sequence-level", "frozen head", "no-grad log-probs")


def auto_against_trl(device: str = "H200") -> str:
    """What `auto` takes at S1-S3 and its modelled time and peak extra memory against TRL 1.16's fused head; a pair
    counts as ahead when both are lower."""
    rates = DEVICES[device]
    lines = [f"Modelled on {rates.name} (`python -m benchmarks.model.roofline --auto-vs-trl --device {device}`): "
             "auto's route, its "
             "time over TRL's head's, its peak extra memory / TRL's (GiB); ahead: lower on both.", "",
             "| shape | " + " | ".join(AGAINST_TRL) + " |", "|---|" + "---|" * len(AGAINST_TRL)]
    ahead = ahead_with_pending = 0
    with_pending = auto_candidates() + PENDING_AUTO
    for label, shape in TARGET_SHAPES.items():
        cells = []
        for name in AGAINST_TRL:
            p = problem(shape, SCENARIOS[name])
            mine, trl = estimate("auto", p, rates), estimate("trl", p, rates)
            time, memory = mine.seconds(rates) / trl.seconds(rates), (mine.peak_extra_bytes, trl.peak_extra_bytes)
            wins = time < 1.0 and memory[0] < memory[1]
            ahead += wins
            _, pending = modelled_route(p, rates, backends=with_pending)
            ahead_with_pending += pending.seconds(rates) < trl.seconds(rates) and \
                pending.peak_extra_bytes < trl.peak_extra_bytes
            cells.append(f"{mine.path.removeprefix('auto: ')}: {time:.2f}x, {memory[0] / GIB:.2f} / "
                         f"{memory[1] / GIB:.2f}{', ahead' if wins else ''}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    pairs = len(AGAINST_TRL) * len(TARGET_SHAPES)
    lines += ["", f"auto ahead of TRL's head on time and memory at {ahead} of {pairs} operation x shape pairs "
                  f"({', '.join(AGAINST_TRL)} at {', '.join(TARGET_SHAPES)}), by the model. With "
                  f"{' and '.join(PENDING_AUTO)} among its candidates too (not yet: no GPU has run "
                  f"{'its kernels' if len(PENDING_AUTO) == 1 else 'their kernels'}, whose rate the model takes from "
                  f"published measurements of the same kind of kernel): {ahead_with_pending} of {pairs}."]
    return "\n".join(lines) + "\n"


def report(paths: list[str], devices: list[str], valid_fraction: float = 1.0, section: str = "all") -> str:
    if section not in SECTIONS:
        raise ValueError(f"section must be one of {SECTIONS}, got {section!r}")
    lines = ["**Roofline model (predicted, not measured)**", "",
             "Predicted time = sum over phases of max(arithmetic time, HBM bytes / HBM bandwidth, L2 reads / L2 "
             "read rate + L2 float32 atomics / L2 atomic rate) + kernel launches and host syncs; L2 GB: reads and "
             "atomics together; a GEMM's arithmetic is timed at its shape (whole 128 x "
             "256 tiles in whole waves over the SMs, each tile's K fill, split-K when the tiles leave SMs idle). "
             "auto: the route `backend=\"auto\"` takes on that device (grpo_kernels/routing.py), named per device "
             "where they differ. "
             "x floor = predicted time / predicted bare GEMMs of the same scenario over every position "
             "(3 for a trained head, 2 frozen, 1 for log-probs); overlapped: if memory-bound phases ran beside "
             "compute-bound ones (max of total FLOP time and total byte time), a lower bound. Peak extra excludes "
             "the inputs, the gradients and one float32 dW copy (its own column); target: <= 1.5 GiB. "
             f"Valid-token fraction: {valid_fraction}.", "", *rates_table(devices)]
    if section in ("all", "targets"):
        lines += ["", "#### Target shapes S1-S3 (bf16)", "", *targets_text(), "",
                  *table(list(TARGET_SHAPES.items()), list(SCENARIOS.values()), paths, devices, valid_fraction)]
    if section in ("all", "gpu-set"):
        lines += ["", "#### GPU benchmark set (benchmarks/suite/shapes.py, bf16), token-level loss", "",
                  *table([(shape.head.name, shape) for shape in SHAPE_SETS["gpu"]], [SCENARIOS["token-level"]],
                         paths, devices, valid_fraction)]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    parser = CommandParser(prog="python -m benchmarks.model.roofline",
                           description=doc_summary(__doc__, first_line=True))
    parser.add_argument("--paths", nargs="+", default=list(MODELS), choices=[*MODELS, *ALTERNATIVES],
                        help="default: every benchmarked path and the floor; also design alternatives: "
                             + ", ".join(ALTERNATIVES))
    parser.add_argument("--device", nargs="+", choices=list(DEVICES), dest="devices",
                        help="default: every modelled device (H200 alone for --auto-vs-trl)")
    parser.add_argument("--section", default="all", choices=SECTIONS, help="which tables (default: all)")
    parser.add_argument("--valid-fraction", type=positive_float("a fraction of the tokens", high=1.0), default=1.0,
                        help="fraction of positions with completion_mask != 0 (default 1.0)")
    parser.add_argument("--auto-vs-trl", action="store_true",
                        help="instead: what auto takes at S1-S3 against TRL's fused head (on the first --device; "
                             "default H200, the GPU the project measured)")
    args = parser.parse_args(argv)
    if args.auto_vs_trl:
        sys.stdout.write(auto_against_trl(args.devices[0] if args.devices else "H200"))
        return 0
    try:
        Problem(1, 1, 1, valid_fraction=args.valid_fraction)
    except ValueError as error:
        parser.error(str(error))
    sys.stdout.write(report(args.paths, args.devices or list(DEVICES), args.valid_fraction, args.section))
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m benchmarks.model.roofline"))
