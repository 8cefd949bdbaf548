"""Loss forward + backward from hidden states and the LM head: the training step."""

import pytest

from .cases import LOSS_CASES, REGIMES
from .paths import PATHS


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case_name", list(LOSS_CASES))
@pytest.mark.parametrize("regime", REGIMES)
def test_loss(benchmark, runner, shape, regime, case_name, path):
    runner.run(benchmark, "loss", shape, regime, case_name, path)
