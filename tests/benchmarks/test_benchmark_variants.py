"""The frozen-head and padding cases run what they say: the right mask, no weight gradient, the reference's numbers."""

import pytest
import torch

from benchmarks.suite.cases import LOSS_CASES, VALID_FRACTIONS
from benchmarks.suite.inputs import make_inputs
from benchmarks.suite.paths import case_mask, make_loss_step, right_padded_mask, valid_tokens
from benchmarks.suite.shapes import SHAPE_SETS

SHAPE = SHAPE_SETS["smoke"][0]


@pytest.mark.parametrize("batch, seq_len", [(2, 32), (8, 256), (3, 5), (1, 7)])
@pytest.mark.parametrize("fraction", [*VALID_FRACTIONS, 0.1, 0.9])
def test_right_padded_mask_has_the_fraction_of_ones_and_right_padding(batch, seq_len, fraction):
    mask = right_padded_mask(batch, seq_len, fraction, torch.device("cpu"))
    assert mask.shape == (batch, seq_len) and mask.dtype == torch.int64
    assert int(mask.sum()) == max(batch, round(fraction * batch * seq_len))
    assert torch.equal(mask, mask.cummin(dim=1).values)  # ones then zeros in every row
    assert bool((mask.sum(1) >= 1).all())


def test_bad_fraction_is_rejected():
    with pytest.raises(ValueError, match="valid_fraction"):
        right_padded_mask(2, 8, 1.5, torch.device("cpu"))


@pytest.mark.parametrize("case_name", ["dapo_kl_valid50", "dapo_kl_frozen_valid25", "dapo_kl_frozen"])
def test_torch_variant_matches_reference_and_skips_the_weight(case_name):
    inputs = make_inputs(SHAPE, "flat", "cpu", seed=4)
    case = LOSS_CASES[case_name]
    got = make_loss_step("torch", inputs, case)()
    expected = make_loss_step("reference", inputs, case)()
    assert len(got) == len(expected) == (1 if case.frozen_head else 2)  # frozen: only dH is asked for
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    mask = case_mask(inputs, case)
    assert valid_tokens(inputs, case_name) == int(mask.sum())
    # padded positions take no part in the loss: their hidden-state gradient is zero
    assert bool((got[0][mask == 0] == 0).all())
