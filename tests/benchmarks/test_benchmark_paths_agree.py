"""The benchmark compares like with like: every path it can run here computes the reference's numbers.

A wrong argument mapping (Liger's epsilon names, old/ref log-probs swapped, a missing KL term) would
make a path look faster for doing different work; this catches it on the smoke shape.
"""

import functools

import pytest
import torch
from grpo_testing import runs_triton, with_triton_interpreted

from benchmarks.suite.cases import LOSS_CASES, STANDARD_LOSS_CASES
from benchmarks.suite.inputs import make_inputs
from benchmarks.suite.interpreter_tiles import SUITE_INTERPRETER_CONFIGS
from benchmarks.suite.paths import PATHS, PathUnavailable, check_available, make_step
from benchmarks.suite.shapes import SHAPE_SETS
from grpo_kernels.kernels.configs import INTERPRETER_CONFIGS

SHAPE = SHAPE_SETS["smoke"][0]
CPU = torch.device("cpu")


@functools.lru_cache(maxsize=1)
def _inputs():
    # Shared by every case: the steps return gradients (torch.autograd.grad) and never write .grad.
    return make_inputs(SHAPE, "peaked", CPU, seed=3)


def _run(path, operation, case_name):
    inputs = _inputs()
    try:
        check_available(path, operation, SHAPE, CPU)
        return make_step(path, operation, inputs, LOSS_CASES[case_name])()
    except PathUnavailable as reason:
        pytest.skip(str(reason))


@pytest.mark.parametrize("path", with_triton_interpreted([p for p in PATHS if p != "reference"]))
@pytest.mark.parametrize("operation", ["loss", "logprobs", "logits"])
@pytest.mark.parametrize("case_name", list(STANDARD_LOSS_CASES))  # variants: test_benchmark_variants.py
def test_path_matches_reference(path, operation, case_name):
    if operation == "logprobs" and case_name != "dapo":
        pytest.skip("forward-only log-probs do not depend on the loss config")
    got = _run(path, operation, case_name)
    expected = _run("reference", operation, case_name)
    _assert_same(got, expected, f"{path} {operation} {case_name}")


def _assert_same(got, expected, label: str) -> None:
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for name, g, e in zip(("first output", "second output"), got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5, msg=lambda m: f"{label} {name}: {m}")


@pytest.mark.parametrize("path", with_triton_interpreted([p for p in PATHS if runs_triton(p)]))
@pytest.mark.parametrize("operation", ["loss", "logprobs"])
@pytest.mark.parametrize("case_name", list(STANDARD_LOSS_CASES))
def test_triton_paths_match_reference_at_the_suites_interpreter_tiles(path, operation, case_name, monkeypatch):
    """The suite runs the interpreter over larger tiles than the library's tests (interpreter_tiles.py): the same
    numbers there too, so its CPU runs time the work the tests check."""
    if operation == "logprobs" and case_name != "dapo":
        pytest.skip("forward-only log-probs do not depend on the loss config")
    expected = _run("reference", operation, case_name)
    for kernel, config in SUITE_INTERPRETER_CONFIGS.items():
        monkeypatch.setitem(INTERPRETER_CONFIGS, kernel, config)
    _assert_same(_run(path, operation, case_name), expected, f"{path} {operation} {case_name} at the suite's tiles")
