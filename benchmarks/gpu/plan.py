"""What the GPU command runs, in what order, and in what time and memory: computed without a GPU, so CI checks it.

    python -m benchmarks.gpu.plan                  # the modelled parts of a first run on an 80 GiB GPU
    python -m benchmarks.gpu.plan --memory-gib 141 --budget-s 540

Cases: at the target shapes S1-S3 every path (and `auto`) in five scenarios (token-level dapo with beta = 0.04
and old/ref log-probs, sequence-level, frozen head, no-grad log-probs, GSPO on-policy) plus the bare GEMMs; at the GPU
benchmark set's shapes every path's token-level loss step plus the bare GEMMs. Order: a correctness smoke
(every backend against float64 on the GPU, at most SMOKE_TIMEOUT_S), then the headline (S1's token-level loss
and S1's no-grad log-probs: the GEMM floor, auto, gemm, TRL, Liger and CCE), then the full GPU tests, then the
rest of S1, S2, S3 and the GPU set, one shape after another so that each shape's inputs are built once; within
a scenario `auto` and `gemm` first, then the reference (every speedup's baseline), the peers, the other
backends.

The command runs as parts that each fit one command of a machine that stops commands after 10 minutes:
every part takes the next items while their modelled time fits its budget; the full GPU tests start only
where their whole timeout fits (else the next part starts with them). A case whose modelled memory does not
fit the device is skipped before it runs; a case whose modelled time would take more than MAX_CASE_S gets
fewer timed rounds. Modelled times are the roofline's predictions times TIME_SAFETY; they leave out
compilation, so they are no measurement.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Callable, Optional

from grpo_engine.cli_parser import CommandParser, doc_summary
from grpo_engine.cli_types import positive_float
from grpo_engine.command_failure import run_tool
from grpo_kernels.backends import BACKENDS, BASELINE_BACKEND, DEFAULT_BACKEND

from ..model.roofline import case_problem, estimate
from ..model.roofline_model import DEVICES, DeviceRates, Problem
from ..model.roofline_paths import MODELS
from ..suite.paths import PATHS, ROUTED
from ..suite.shapes import SHAPE_SETS, TARGET_SHAPES, BenchShape

GPU_PATHS = (*ROUTED, *PATHS)  # what the GPU command benchmarks: auto, this package's backends, the peers

PART_BUDGET_S = 9 * 60  # one invocation: a command is stopped at 10 minutes on the lent GPU machines
TESTS_TIMEOUT_S = 8 * 60  # `pytest -m gpu`, inside one part's budget
SMOKE_TIMEOUT_S = 2 * 60  # the correctness smoke before anything else
TEST_TIMEOUT_S = 180  # one GPU test (pytest-timeout, where installed): a hung test fails alone
WRITE_MARGIN_S = 20  # kept free at the end of a part: the last results files, and slack
SHAPE_SETUP_S = 10  # building one shape's inputs on the GPU
CASE_OVERHEAD_S = 3  # per case beyond its steps: building the step, freeing memory, writing the results
MAX_CASE_S = 20  # timed rounds are cut so that one case takes about this long at most
ROUNDS, WARMUP_ROUNDS, MIN_ROUNDS = 10, 2, 3
# Modelled time is a lower bound (compilation, launch gaps, allocator): budget this many times more.
TIME_SAFETY = 2.0
# Modelled memory leaves out the allocator's fragmentation and small buffers.
MEMORY_SAFETY = 1.15

# (label in the results, operation, case name): the five scenarios of the target shapes, in priority order.
TARGET_SCENARIOS = (
    ("token-level", "loss", "dapo_kl"),
    ("sequence-level", "loss", "gspo_kl"),
    ("frozen head", "loss", "dapo_kl_frozen"),
    ("no-grad log-probs", "logprobs", "dapo_kl"),
    ("on-policy sequence-level", "loss", "gspo_on_policy"),
)
# Within a scenario: the default backend, the baseline, the peers, then any other path in PATHS order.
PATH_PRIORITY = ("auto", DEFAULT_BACKEND, BASELINE_BACKEND, "liger", "cce", "trl")
# The headline: what a short GPU loan must measure first (S1; the floor is every ratio's denominator): auto, the
# default backend, every backend of Triton kernels (the deterministic default and the opt-in atomic backward side
# by side), and the peers.
TRITON_BACKENDS = tuple(name for name, spec in BACKENDS.items() if spec.triton_kernels)
HEADLINE_PATHS = ("floor", "auto", DEFAULT_BACKEND, *TRITON_BACKENDS, "trl", "liger", "cce")
HEADLINE_SCENARIOS = (("loss", "dapo_kl"), ("logprobs", "dapo_kl"))


@dataclass(frozen=True)
class GpuCase:
    path: str  # a path of benchmarks.suite.paths, or "floor"
    operation: str  # "loss" or "logprobs"
    case_name: str  # a key of LOSS_CASES ("-" for the floor)
    shape: BenchShape

    @property
    def id(self) -> str:
        return f"{self.shape.id}-{self.operation}-{self.case_name}-{self.path}"


def by_priority(paths: tuple[str, ...]) -> list[str]:
    return sorted(paths, key=lambda p: (PATH_PRIORITY.index(p) if p in PATH_PRIORITY else len(PATH_PRIORITY),
                                        paths.index(p)))


def is_headline(case: GpuCase) -> bool:
    return (case.shape == TARGET_SHAPES["S1"] and case.path in HEADLINE_PATHS
            and (case.operation, "dapo_kl" if case.path == "floor" else case.case_name) in HEADLINE_SCENARIOS)


def case_list(paths: tuple[str, ...]) -> list[GpuCase]:
    """Every case of the GPU command in priority order: the headline, then the rest grouped by shape (one input
    build per shape; S1's rest follows the headline on the same inputs)."""
    cases = _all_cases(paths)
    return [case for case in cases if is_headline(case)] + [case for case in cases if not is_headline(case)]


def _all_cases(paths: tuple[str, ...]) -> list[GpuCase]:
    ordered = by_priority(paths)
    cases: list[GpuCase] = []
    for shape in TARGET_SHAPES.values():
        for _, operation, case_name in TARGET_SCENARIOS:
            if case_name == "dapo_kl" and operation == "loss":  # the 3-GEMM floor beside the headline
                cases.append(GpuCase("floor", "loss", "-", shape))
            if operation == "logprobs":
                cases.append(GpuCase("floor", "logprobs", "-", shape))
            cases += [GpuCase(path, operation, case_name, shape) for path in ordered]
    for shape in SHAPE_SETS["gpu"]:
        cases.append(GpuCase("floor", "loss", "-", shape))
        cases += [GpuCase(path, "loss", "dapo_kl", shape) for path in ordered]
    return cases


def _problem(case: GpuCase) -> Problem:
    s = case.shape
    p = case_problem(case.operation, case.case_name, s.head.hidden, s.head.vocab, s.tokens, s.dtype,
                     sequence_rows=s.seq_len)
    if p is None:
        raise ValueError(f"the roofline model does not cover {case.id} (GPU cases are 16-bit loss or log-probs)")
    return p


def needed_bytes(case: GpuCase) -> int:
    """Inputs + gradients + the modelled peak extra (and float32 dW copy) of the case, with a safety margin."""
    p, s = _problem(case), case.shape
    c = p.itemsize
    inputs = (s.tokens * s.head.hidden + s.head.vocab * s.head.hidden) * c + s.tokens * 8 * 6
    grads = (s.tokens * s.head.hidden * c * p.hidden_needs_grad + s.head.vocab * s.head.hidden * c * p.weight_grad)
    est = estimate(case.path if case.path in MODELS else BASELINE_BACKEND, p)
    return math.ceil(MEMORY_SAFETY * (inputs + grads + est.peak_extra_bytes + est.fp32_weight_grad_bytes))


def step_seconds(case: GpuCase, rates: DeviceRates = DEVICES["H100"]) -> float:
    """Modelled time of one step on the slower of the two GPUs, times the safety factor."""
    return TIME_SAFETY * estimate(case.path if case.path in MODELS else BASELINE_BACKEND,
                                  _problem(case)).seconds(rates)


def rounds_for(case: GpuCase) -> int:
    """Timed rounds: ROUNDS unless that would take the case past MAX_CASE_S (never fewer than MIN_ROUNDS)."""
    per_step = step_seconds(case)
    affordable = int(MAX_CASE_S / per_step) - WARMUP_ROUNDS - 1  # one more step measures the memory
    return max(MIN_ROUNDS, min(ROUNDS, affordable))


def case_seconds(case: GpuCase) -> float:
    """Modelled wall time of one case: its warm-up, timed and memory steps, and the per-case overhead."""
    return step_seconds(case) * (rounds_for(case) + WARMUP_ROUNDS + 1) + CASE_OVERHEAD_S


def seconds_needed(case: GpuCase, new_shape: bool) -> float:
    """What a part must have left to start `case`: the case, and its inputs when its shape is new."""
    return case_seconds(case) + (SHAPE_SETUP_S if new_shape else 0.0)


def fits(elapsed_s: float, need_s: float, budget_s: float) -> bool:
    """The part's rule for starting one more item: it ends inside the budget with the write margin left."""
    return elapsed_s + need_s <= budget_s - WRITE_MARGIN_S


@dataclass
class Plan:
    cases: list[GpuCase]  # fit the device's memory and one part's time, in priority order
    skipped: list[tuple[GpuCase, str]]  # never run, with the reason


def make_plan(paths: tuple[str, ...], device_memory_bytes: int, part_budget_s: float = PART_BUDGET_S) -> Plan:
    """The cases that fit the device's memory and a part's budget, in priority order."""
    if device_memory_bytes <= 0:
        raise ValueError(f"device_memory_bytes must be positive, got {device_memory_bytes}")
    if part_budget_s <= WRITE_MARGIN_S + SHAPE_SETUP_S:
        raise ValueError(f"part_budget_s must exceed {WRITE_MARGIN_S + SHAPE_SETUP_S} s (the write margin and one "
                         f"shape's setup), got {part_budget_s}")
    cases, skipped = [], []
    for case in case_list(paths):
        need, cost = needed_bytes(case), seconds_needed(case, new_shape=True)
        if need > device_memory_bytes:
            skipped.append((case, f"{case.path}: needs about {need / 2**30:.1f} GiB by the roofline model "
                                  f"(device has {device_memory_bytes / 2**30:.1f} GiB)"))
        elif not fits(0.0, cost, part_budget_s):
            skipped.append((case, f"{case.path}: about {cost:.0f} s by the roofline model, more than one "
                                  f"{part_budget_s:.0f} s part of the GPU command"))
        else:
            cases.append(case)
    return Plan(cases, skipped)


@dataclass
class ModelledPart:
    steps: list  # in order: "smoke", "tests" (the GPU checks) and GpuCases
    seconds: float  # modelled wall time (each check at its full timeout)

    @property
    def tests(self) -> bool:
        return "tests" in self.steps

    @property
    def cases(self) -> list[GpuCase]:
        return [step for step in self.steps if isinstance(step, GpuCase)]


def schedule(plan: Plan, part_budget_s: float = PART_BUDGET_S, tests_timeout_s: Optional[float] = TESTS_TIMEOUT_S,
             need: Callable[[GpuCase, bool], float] = seconds_needed,
             smoke_timeout_s: Optional[float] = SMOKE_TIMEOUT_S) -> list[ModelledPart]:
    """The parts a run takes by the model: the same rule the command applies to the wall clock.

    The smoke first, the headline cases, the tests (where their whole timeout fits a part), the rest.
    tests_timeout_s / smoke_timeout_s None: no such check (--skip-tests). Checks are counted at their timeout.
    """
    headline = [case for case in plan.cases if is_headline(case)]
    rest = [case for case in plan.cases if not is_headline(case)]
    pending: list = (["smoke"] if smoke_timeout_s is not None else []) + headline \
        + (["tests"] if tests_timeout_s is not None else []) + rest
    limit = part_budget_s - WRITE_MARGIN_S
    parts: list[ModelledPart] = []
    while pending:
        elapsed, steps, shape = 0.0, [], None
        while pending:
            step = pending[0]
            if step in ("smoke", "tests"):
                timeout = smoke_timeout_s if step == "smoke" else tests_timeout_s
                if steps and elapsed + timeout > limit:
                    break
                cost = min(timeout, limit - elapsed)
            else:
                cost = need(step, step.shape != shape)
                if not fits(elapsed, cost, part_budget_s):
                    break
                shape = step.shape
            elapsed += cost
            steps.append(pending.pop(0))
        if not steps:
            raise ValueError(f"{pending[0].id} does not fit a {part_budget_s:.0f} s part")  # make_plan skips these
        parts.append(ModelledPart(steps, elapsed))
    return parts


def headline_done_s(parts: list[ModelledPart], need: Callable[[GpuCase, bool], float] = seconds_needed,
                    smoke_timeout_s: float = SMOKE_TIMEOUT_S, tests_timeout_s: float = TESTS_TIMEOUT_S) -> float:
    """Modelled seconds from the first part's start until the last headline case is done (parts back to back)."""
    done, elapsed = 0.0, 0.0
    for part in parts:
        shape = None
        for step in part.steps:
            if step == "smoke":
                elapsed += smoke_timeout_s
            elif step == "tests":
                elapsed += tests_timeout_s
            else:
                elapsed += need(step, step.shape != shape)
                shape = step.shape
                if is_headline(step):
                    done = elapsed
        elapsed = sum(p.seconds for p in parts[:parts.index(part) + 1])
    return done


def schedule_lines(parts: list[ModelledPart]) -> list[str]:
    lines = ["| part | what | cases | modelled minutes |", "|---:|---|---:|---:|"]
    names = {"smoke": "correctness smoke", "tests": "`pytest -m gpu`"}
    for number, part in enumerate(parts, 1):
        what, run = [], []
        for step in part.steps + [None]:
            if isinstance(step, GpuCase):
                run.append(step)
                continue
            if run:
                what.append(f"{run[0].id} ... {run[-1].id}")
                run = []
            if step is not None:
                what.append(names[step])
        lines.append(f"| {number} | {', then '.join(what)} | {len(part.cases)} | {part.seconds / 60:.1f} |")
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    parser = CommandParser(prog="python -m benchmarks.gpu_plan", description=doc_summary(__doc__, first_line=True))
    parser.add_argument("--memory-gib", type=positive_float("GiB of free GPU memory"), default=80.0,
                        help="free GPU memory (default 80: an H100)")
    parser.add_argument("--budget-s", type=positive_float("seconds"), default=PART_BUDGET_S,
                        help="one part's budget (default 540)")
    parser.add_argument("--skip-tests", action="store_true", help="no tests part")
    args = parser.parse_args(argv)
    try:
        plan = make_plan(GPU_PATHS, int(args.memory_gib * 2**30), args.budget_s)
    except ValueError as error:
        parser.error(str(error))
    checks = None if args.skip_tests else TESTS_TIMEOUT_S
    parts = schedule(plan, args.budget_s, checks, smoke_timeout_s=None if args.skip_tests else SMOKE_TIMEOUT_S)
    print(f"Paths: {', '.join(by_priority(GPU_PATHS))}; {len(plan.cases)} cases fit {args.memory_gib:g} GiB, "
          f"{len(plan.skipped)} skipped by the model; parts of {args.budget_s:.0f} s, the correctness smoke counted "
          f"at its {SMOKE_TIMEOUT_S} s timeout and `pytest -m gpu` at its {TESTS_TIMEOUT_S} s. Modelled (roofline x "
          f"{TIME_SAFETY:g} + setup), not measured; a path that is not installed is skipped at once, so its cases "
          f"take no time.\n")
    print("\n".join(schedule_lines(parts)))
    total = sum(part.seconds for part in parts)
    headline = headline_done_s(parts, smoke_timeout_s=0.0 if args.skip_tests else SMOKE_TIMEOUT_S)
    print(f"\nheadline (S1 token-level loss and no-grad log-probs: {', '.join(HEADLINE_PATHS)}): done by modelled "
          f"minute {headline / 60:.1f} of part 1" if headline <= parts[0].seconds else
          f"\nheadline: done by modelled minute {headline / 60:.1f} (after part 1)")
    print(f"{len(parts)} parts, {total / 60:.1f} modelled minutes in all.")
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m benchmarks.gpu.plan"))
