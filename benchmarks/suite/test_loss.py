"""Loss forward + backward from hidden states and the LM head: the training step."""

import pytest

from .cases import REGIMES, STANDARD_LOSS_CASES
from .paths import PATHS


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case_name", list(STANDARD_LOSS_CASES))
@pytest.mark.parametrize("regime", REGIMES)
def test_loss(benchmark, runner, shape, regime, case_name, path):
    runner.run(benchmark, "loss", shape, regime, case_name, path)
