"""The loss from logits the caller already holds, forward + backward (gradient w.r.t. the logits)."""

import pytest

from .cases import REGIMES, STANDARD_LOSS_CASES
from .paths import PATHS


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case_name", list(STANDARD_LOSS_CASES))
@pytest.mark.parametrize("regime", REGIMES)
def test_logits_loss(benchmark, runner, shape, regime, case_name, path):
    runner.run(benchmark, "logits", shape, regime, case_name, path)
