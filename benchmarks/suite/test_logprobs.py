"""Forward-only per-token log-probs (the old / reference log-prob pass); no loss config involved."""

import pytest

from .cases import REGIMES
from .paths import PATHS


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("regime", REGIMES)
def test_logprobs(benchmark, runner, shape, regime, path):
    runner.run(benchmark, "logprobs", shape, regime, "dapo", path)
