"""The `trl` benchmark path runs TRL 1.16's own code, called as GRPOTrainer calls it, and computes the
reference's numbers; without TRL it is skipped with the reason."""

import importlib.util
from dataclasses import replace

import pytest
import torch

from benchmarks.suite.cases import LOSS_CASES
from benchmarks.suite.inputs import make_inputs
from benchmarks.suite.paths import PathUnavailable, check_available, make_step, require_trl
from benchmarks.suite.shapes import SHAPE_SETS

SHAPE = SHAPE_SETS["smoke"][0]
CPU = torch.device("cpu")


def test_skipped_with_the_reason_when_trl_is_missing(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: None if name == "trl" else real_find_spec(name, *rest))
    with pytest.raises(PathUnavailable, match=r"trl is not installed \(pip install trl\)"):
        check_available("trl", "loss", SHAPE, CPU)


def _skip_without_trl() -> None:
    try:
        require_trl()
    except PathUnavailable as reason:
        pytest.skip(str(reason))


def test_no_logits_input_operation():
    _skip_without_trl()
    with pytest.raises(PathUnavailable, match="starts from hidden states"):
        check_available("trl", "logits", SHAPE, CPU)


@pytest.fixture
def trl_head_calls(monkeypatch):
    """The arguments of every call of TRL's chunked log-prob function (still run: the wrapper passes through)."""
    _skip_without_trl()
    from trl.trainer import utils as trl_utils

    function = trl_utils._ChunkedLogProbFunction
    calls = []
    original = function.apply

    def recording(*args):
        calls.append(args)
        return original(*args)

    monkeypatch.setattr(function, "apply", recording)
    return calls


@pytest.mark.parametrize("case_name", ["dapo_kl", "dapo_kl_frozen_valid25", "gspo_kl"])
def test_loss_step_is_trls_head_and_matches_the_reference(case_name, trl_head_calls):
    inputs = make_inputs(SHAPE, "flat", CPU, seed=5)
    # a sampling temperature other than 1: TRL divides the logits by it inside its head
    case = replace(LOSS_CASES[case_name], config=replace(LOSS_CASES[case_name].config, temperature=0.7))
    check_available("trl", "loss", SHAPE, CPU)
    got = make_step("trl", "loss", inputs, case)()
    expected = make_step("reference", "loss", inputs, case)()
    assert len(got) == len(expected) == (1 if case.frozen_head else 2)
    for name, g, e in zip(("hidden", "weight"), got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5, msg=lambda m: f"{case_name} d{name}: {m}")
    # one call of TRL's head, with GRPOTrainer's arguments: its temperature, 32768-wide vocabulary tiles, no
    # softcap or logit scale, the policy's log-probs and entropies; on a CPU every position is scored
    [(hidden, weight, bias, targets, temperature, chunk, softcap, scale, outputs)] = trl_head_calls
    assert (temperature, chunk, softcap, scale, outputs) == (0.7, 32768, None, 1.0, ("log_probs", "entropy"))
    assert hidden.shape == (SHAPE.tokens, SHAPE.head.hidden) and bias is None
    assert weight.requires_grad == (not case.frozen_head)


def test_logprobs_step_is_trls_reference_model_head(trl_head_calls):
    inputs = make_inputs(SHAPE, "peaked", CPU, seed=6)
    got = make_step("trl", "logprobs", inputs, LOSS_CASES["dapo"])()
    expected = make_step("reference", "logprobs", inputs, LOSS_CASES["dapo"])()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert not got.requires_grad
    [call] = trl_head_calls
    assert call[-1] == ("log_probs",)  # the reference model's head: log-probs only
