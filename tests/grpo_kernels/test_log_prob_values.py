"""old_logps / ref_logps above 0 at a scored token are not log-probabilities (probabilities, or negative
log-likelihoods, passed in their place): each entry point says so in one warning naming the argument and the
position, and computes the loss as given (TRL's and Liger's own tests feed random values). Values at or below
validation.LOG_PROB_SLACK, and anything at a padded position, pass without a word."""

import os
import warnings

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_kernels import FusedLinearGRPOLoss, GRPOLossConfig, fused_linear_grpo_loss, grpo_loss_from_logits
from grpo_kernels.validation import LOG_PROB_SLACK, LogProbValueWarning

DERANDOMIZE = bool(os.environ.get("CI"))
B, T, H, V = 2, 5, 8, 16


def _call(entry: str, old: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(B, T, H, generator=gen), torch.randn(V, H, generator=gen)
    ids, advantages = torch.randint(0, V, (B, T), generator=gen), torch.randn(B, generator=gen)
    config = GRPOLossConfig(beta=0.04)
    if entry == "loss":
        return fused_linear_grpo_loss(hidden, weight, ids, mask, advantages, old_logps=old, ref_logps=ref,
                                      config=config, backend="gemm").loss
    if entry == "logits":
        return grpo_loss_from_logits(hidden @ weight.T, ids, mask, advantages, old_logps=old, ref_logps=ref,
                                     config=config).loss
    module = FusedLinearGRPOLoss(beta=0.04, use_ref_model=True)
    return module(hidden, weight, ids, mask, advantages, ref_per_token_logps=ref, old_per_token_logps=old)[0]


@settings(max_examples=40, deadline=None, derandomize=DERANDOMIZE)
@given(entry=st.sampled_from(["loss", "logits", "module"]), which=st.sampled_from(["old", "ref"]),
       where=st.sampled_from(["none", "padded", "scored"]),
       value=st.floats(LOG_PROB_SLACK * 1.01, 50.0), seed=st.integers(0, 1000))
def test_a_log_prob_above_zero_at_a_scored_token_is_said_and_nothing_else_is(entry, which, where, value, seed):
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(B, T, generator=gen) > 0.3).long()
    mask[0, 0], mask[1, 1] = 1, 0
    # log-probabilities as a log-softmax gives them: at most 0, some within rounding of it
    old = -torch.rand(B, T, generator=gen) * 5
    ref = -torch.rand(B, T, generator=gen) * 5
    old[0, 1], ref[0, 2] = LOG_PROB_SLACK, 1e-7
    target = old if which == "old" else ref
    if where != "none":
        target[(0, 0) if where == "scored" else (1, 1)] = value
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = _call(entry, old, ref, mask)
    said = [w for w in caught if issubclass(w.category, LogProbValueWarning)]
    assert torch.isfinite(loss)
    if where != "scored":
        assert said == []
        return
    assert len(said) == 1, [str(w.message) for w in said]
    message = str(said[0].message)
    name = {"old": {"module": "old_per_token_logps"}, "ref": {"module": "ref_per_token_logps"}}[which].get(
        entry, f"{which}_logps")
    assert message.startswith(f"{name} is ") and "at position [0, 0]" in message
    assert said[0].filename == __file__  # attributed to the caller's line, not the library's
