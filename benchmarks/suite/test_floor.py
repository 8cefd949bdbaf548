"""The bare-GEMM floor of each shape: 3 GEMMs for the loss step, 1 for the forward-only log-probs.

Measured on the flat inputs only: a dense GEMM's time does not depend on the values.
"""

import pytest


@pytest.mark.parametrize("operation", ["loss", "logprobs"])
def test_floor(benchmark, runner, shape, operation):
    runner.run(benchmark, operation, shape, "flat", "-", "floor")
