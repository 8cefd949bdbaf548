"""Frozen LM head vs trained, and right padding at 100%, 50% and 25% valid tokens: the loss step of the
padding-free backends (torch, and gemm where the API has it), whose time and memory should follow the
valid tokens, not B x T, and drop the dW work when the head is frozen."""

import pytest

from .cases import VALID_FRACTIONS
from .paths import PATHS

BACKENDS = [name for name in ("torch", "gemm") if name in PATHS]
CASES = [f"dapo_kl{'_frozen' if frozen else ''}_valid{round(f * 100)}"
         for frozen in (False, True) for f in VALID_FRACTIONS]


@pytest.mark.parametrize("path", BACKENDS)
@pytest.mark.parametrize("case_name", CASES)
def test_frozen_head_and_padding(benchmark, runner, shape, case_name, path):
    runner.run(benchmark, "loss", shape, "flat", case_name, path)
