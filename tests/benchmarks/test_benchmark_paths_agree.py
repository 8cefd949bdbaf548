"""The benchmark compares like with like: every path it can run here computes the reference's numbers.

A wrong argument mapping (Liger's epsilon names, old/ref log-probs swapped, a missing KL term) would
make a path look faster for doing different work; this catches it on the smoke shape.
"""

import functools

import pytest
import torch
from grpo_testing import with_triton_interpreted

from benchmarks.suite.cases import LOSS_CASES, STANDARD_LOSS_CASES
from benchmarks.suite.inputs import make_inputs
from benchmarks.suite.paths import PATHS, PathUnavailable, check_available, make_step
from benchmarks.suite.shapes import SHAPE_SETS

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
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for name, g, e in zip(("first output", "second output"), got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5, msg=lambda m: f"{path} {operation} {case_name} {name}: {m}")
