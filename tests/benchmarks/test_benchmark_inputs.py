"""The benchmark inputs are what the issue asks for: two entropy regimes, on-policy tokens, reproducible."""

import math

import pytest
import torch

from benchmarks.suite.inputs import load_inputs, make_inputs, save_inputs
from benchmarks.suite.shapes import CPU_HEAD, BenchShape

SHAPE = BenchShape(CPU_HEAD, 2, 128, "float32")


def test_peaked_regime_has_low_entropy_and_flat_regime_high():
    peaked = make_inputs(SHAPE, "peaked", "cpu")
    flat = make_inputs(SHAPE, "flat", "cpu")
    assert 0.3 <= peaked.mean_entropy <= 1.5
    assert flat.mean_entropy > 0.9 * math.log(CPU_HEAD.vocab)
    assert peaked.logit_scale > 1.0 and flat.logit_scale == 1.0


def test_tokens_are_sampled_from_the_policy():
    # On peaked logits the policy's own samples are mostly its argmax; uniform tokens almost never would be.
    inputs = make_inputs(SHAPE, "peaked", "cpu")
    with torch.no_grad():
        argmax = (inputs.hidden @ inputs.weight.T).argmax(-1)
    assert (argmax == inputs.completion_ids).float().mean() > 0.5
    assert inputs.completion_ids.min() >= 0 and inputs.completion_ids.max() < CPU_HEAD.vocab


def test_masks_are_right_padded_and_inputs_reproducible(tmp_path):
    a = make_inputs(SHAPE, "flat", "cpu", seed=5)
    b = make_inputs(SHAPE, "flat", "cpu", seed=5)
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.hidden, b.hidden)
    mask = a.completion_mask
    assert mask[0].all()  # the first completion is full length
    assert torch.equal(mask, mask.cummin(dim=1).values)  # ones then zeros: right padding
    path = str(tmp_path / "inputs.pt")
    save_inputs(a, path)
    loaded = load_inputs(path)
    assert torch.equal(loaded.weight, a.weight) and loaded.hidden.requires_grad


def test_unknown_regime_is_rejected():
    with pytest.raises(ValueError, match="regime"):
        make_inputs(SHAPE, "sharp", "cpu")
