"""What the GPU command runs, and in what time and memory: computed without a GPU, so CI checks it.

Cases: at issue 9's target shapes S1-S3 every path in four scenarios (token-level dapo with beta = 0.04 and
old/ref log-probs, sequence-level, frozen head, no-grad log-probs) plus the bare GEMMs; at the GPU
benchmark set's shapes every path's token-level loss step plus the bare GEMMs. A case whose modelled
memory does not fit the device is skipped before it runs; a case whose modelled time would take more than
MAX_CASE_S gets fewer timed rounds; cases are admitted in priority order while the modelled time fits the
budget, and the run itself stops starting cases when the wall clock says the budget is spent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .roofline import case_problem, estimate
from .roofline_model import DEVICES, DeviceRates, Problem
from .roofline_paths import MODELS
from .shapes import SHAPE_SETS, TARGET_SHAPES, BenchShape

TOTAL_BUDGET_S = 20 * 60  # the whole command, tests included, on one H100 or H200
TESTS_BUDGET_S = 6 * 60  # `pytest -m gpu`
WRITE_MARGIN_S = 60  # writing the results and the report, and slack
SHAPE_SETUP_S = 10  # building one shape's inputs on the GPU
MAX_CASE_S = 20  # timed rounds are cut so that one case takes about this long at most
ROUNDS, WARMUP_ROUNDS, MIN_ROUNDS = 10, 2, 3
# Modelled time is a lower bound (compilation, launch gaps, allocator): budget this many times more.
TIME_SAFETY = 2.0
# Modelled memory leaves out the allocator's fragmentation and small buffers.
MEMORY_SAFETY = 1.15

# (label in the results, operation, case name): the four scenarios of the target shapes.
TARGET_SCENARIOS = (
    ("token-level", "loss", "dapo_kl"),
    ("sequence-level", "loss", "gspo_kl"),
    ("frozen head", "loss", "dapo_kl_frozen"),
    ("no-grad log-probs", "logprobs", "dapo_kl"),
)


@dataclass(frozen=True)
class GpuCase:
    path: str  # a path of benchmarks.paths, or "floor"
    operation: str  # "loss" or "logprobs"
    case_name: str  # a key of LOSS_CASES ("-" for the floor)
    shape: BenchShape

    @property
    def id(self) -> str:
        return f"{self.shape.id}-{self.operation}-{self.case_name}-{self.path}"


def case_list(paths: tuple[str, ...]) -> list[GpuCase]:
    """Every case of the GPU command, grouped by shape (one input build per shape)."""
    cases: list[GpuCase] = []
    for shape in TARGET_SHAPES.values():
        cases += [GpuCase("floor", "loss", "-", shape), GpuCase("floor", "logprobs", "-", shape)]
        cases += [GpuCase(path, operation, case_name, shape)
                  for _, operation, case_name in TARGET_SCENARIOS for path in paths]
    for shape in SHAPE_SETS["gpu"]:
        cases.append(GpuCase("floor", "loss", "-", shape))
        cases += [GpuCase(path, "loss", "dapo_kl", shape) for path in paths]
    return cases


def _problem(case: GpuCase) -> Problem:
    s = case.shape
    p = case_problem(case.operation, case.case_name, s.head.hidden, s.head.vocab, s.tokens, s.dtype)
    if p is None:
        raise ValueError(f"the roofline model does not cover {case.id} (GPU cases are 16-bit loss or log-probs)")
    return p


def needed_bytes(case: GpuCase) -> int:
    """Inputs + gradients + the modelled peak extra (and float32 dW copy) of the case, with a safety margin."""
    p, s = _problem(case), case.shape
    c = p.itemsize
    inputs = (s.tokens * s.head.hidden + s.head.vocab * s.head.hidden) * c + s.tokens * 8 * 6
    grads = (s.tokens * s.head.hidden * c * p.hidden_needs_grad + s.head.vocab * s.head.hidden * c * p.weight_grad)
    est = estimate(case.path if case.path in MODELS else "reference", p)
    return math.ceil(MEMORY_SAFETY * (inputs + grads + est.peak_extra_bytes + est.fp32_weight_grad_bytes))


def step_seconds(case: GpuCase, rates: DeviceRates = DEVICES["H100"]) -> float:
    """Modelled time of one step on the slower of the two GPUs, times the safety factor."""
    return TIME_SAFETY * estimate(case.path if case.path in MODELS else "reference", _problem(case)).seconds(rates)


def rounds_for(case: GpuCase) -> int:
    """Timed rounds: ROUNDS unless that would take the case past MAX_CASE_S (never fewer than MIN_ROUNDS)."""
    per_step = step_seconds(case)
    affordable = int(MAX_CASE_S / per_step) - WARMUP_ROUNDS - 1  # one more step measures the memory
    return max(MIN_ROUNDS, min(ROUNDS, affordable))


def case_seconds(case: GpuCase) -> float:
    return step_seconds(case) * (rounds_for(case) + WARMUP_ROUNDS + 1)


@dataclass
class Plan:
    cases: list[GpuCase]  # expected to fit the budget, in priority order
    over_budget: list[tuple[GpuCase, str]]  # fit in memory, not in the modelled budget: run if time is left
    skipped: list[tuple[GpuCase, str]]  # do not fit in memory: never run
    benchmark_budget_s: float

    @property
    def planned_seconds(self) -> float:
        return sum(case_seconds(case) for case in self.cases) + SHAPE_SETUP_S * len({c.shape for c in self.cases})


def make_plan(paths: tuple[str, ...], device_memory_bytes: int, total_budget_s: float = TOTAL_BUDGET_S,
              run_tests: bool = True) -> Plan:
    """The cases that fit the device's memory, and the time left for them once the tests are budgeted."""
    if device_memory_bytes <= 0:
        raise ValueError(f"device_memory_bytes must be positive, got {device_memory_bytes}")
    budget = total_budget_s - WRITE_MARGIN_S - (TESTS_BUDGET_S if run_tests else 0)
    if budget <= 0:
        raise ValueError(f"total_budget_s = {total_budget_s} leaves no time for the benchmarks "
                         f"(tests {TESTS_BUDGET_S if run_tests else 0} s + writing {WRITE_MARGIN_S} s)")
    cases, over_budget, skipped = [], [], []
    spent, shapes = 0.0, set()
    # In priority order (the target shapes first): a case that would overrun the budget is skipped, and
    # cheaper ones after it still run.
    for case in case_list(paths):
        need = needed_bytes(case)
        cost = case_seconds(case) + (SHAPE_SETUP_S if case.shape not in shapes else 0.0)
        if need > device_memory_bytes:
            skipped.append((case, f"{case.path}: needs about {need / 2**30:.1f} GiB by the roofline model "
                                  f"(device has {device_memory_bytes / 2**30:.1f} GiB)"))
        elif spent + cost > budget:
            over_budget.append((case, f"{case.path}: about {cost:.0f} s by the roofline model, beyond the "
                                  f"{budget:.0f} s benchmark budget of the GPU command"))
        else:
            cases.append(case)
            spent += cost
            shapes.add(case.shape)
    return Plan(cases, over_budget, skipped, budget)
