"""FusedLinearGRPOLoss keeps Liger's constructor and forward, so swapping the import is the migration."""

import inspect

import pytest
import torch
from grpo_testing import make_problem

from grpo_kernels import FusedLinearGRPOLoss, GRPOLossConfig, fused_linear_grpo_loss, linear_logprobs

LIGER_INIT = ["beta", "compiled", "use_ref_model", "chunk_size", "epsilon_low", "epsilon_high", "loss_type",
              "max_completion_length", "importance_sampling_level", "sapo_temperature_pos", "sapo_temperature_neg",
              "temperature"]
LIGER_FORWARD = ["_input", "lin_weight", "selected_token_ids", "attention_mask", "advantages", "bias",
                 "ref_per_token_logps", "old_per_token_logps", "ref_input", "ref_weight", "ref_bias", "vllm_is_ratio",
                 "num_items_in_batch"]


def test_signatures_follow_liger():
    init = list(inspect.signature(FusedLinearGRPOLoss.__init__).parameters)[1:]
    assert init[: len(LIGER_INIT)] == LIGER_INIT
    forward = list(inspect.signature(FusedLinearGRPOLoss.forward).parameters)[1:]
    assert forward[: len(LIGER_FORWARD)] == LIGER_FORWARD  # then our extras (kept_token_ids), keyword-style


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_forward_returns_loss_and_liger_metrics(beta):
    p = make_problem(seed=2, B=2, T=4, H=16, V=40)
    module = FusedLinearGRPOLoss(beta=beta, loss_type="bnpo", epsilon_high=0.28)
    hidden = p.hidden.clone().requires_grad_()
    loss, metrics = module(hidden.view(-1, 16), p.weight, p.completion_ids, p.completion_mask, p.advantages,
                           bias=p.bias, ref_per_token_logps=p.ref_logps, old_per_token_logps=p.old_logps)
    expected = fused_linear_grpo_loss(p.hidden, p.weight, p.completion_ids, p.completion_mask, p.advantages,
                                      bias=p.bias, old_logps=p.old_logps, ref_logps=p.ref_logps,
                                      config=GRPOLossConfig(loss_type="bnpo", beta=beta, epsilon_high=0.28))
    assert len(metrics) == (2 if beta else 1)
    torch.testing.assert_close(loss, expected.loss)
    torch.testing.assert_close(metrics[-1], expected.metrics["clip_ratio/region_mean"])
    if beta:
        torch.testing.assert_close(metrics[0], expected.metrics["kl"])
    loss.backward()
    assert hidden.grad is not None and hidden.grad.abs().sum() > 0


def test_reference_hidden_states_give_ref_logps():
    p = make_problem(seed=3, B=2, T=4, H=16, V=40, with_bias=False)
    ref_hidden = p.hidden + 0.1
    module = FusedLinearGRPOLoss(beta=0.04)
    loss, (kl, _) = module(p.hidden, p.weight, p.completion_ids, p.completion_mask, p.advantages,
                           ref_input=ref_hidden, ref_weight=p.weight)
    ref_logps = linear_logprobs(ref_hidden, p.weight, p.completion_ids)
    loss2, (kl2, _) = module(p.hidden, p.weight, p.completion_ids, p.completion_mask, p.advantages,
                             ref_per_token_logps=ref_logps)
    torch.testing.assert_close(loss, loss2)
    torch.testing.assert_close(kl, kl2)
    assert float(kl) > 0
    with pytest.raises(ValueError, match="beta != 0 needs ref_per_token_logps"):
        module(p.hidden, p.weight, p.completion_ids, p.completion_mask, p.advantages)


@pytest.mark.parametrize("loss_type", ["dapo", "sapo", "vespo"])
def test_metrics_match_liger_module(loss_type):
    """Same inputs through Liger's own module on CPU: the same loss and the same metric list (Liger reports a clip
    ratio of 0 for sapo and vespo)."""
    liger = pytest.importorskip("liger_kernel.chunked_loss")
    p = make_problem(seed=4, B=2, T=5, H=16, V=40, with_bias=False)
    kwargs = dict(beta=0.04, loss_type=loss_type, epsilon_high=0.28)
    theirs = liger.LigerFusedLinearGRPOLoss(**kwargs, compiled=False)
    ours = FusedLinearGRPOLoss(**kwargs)
    args = (p.hidden, p.weight, p.completion_ids, p.completion_mask, p.advantages)
    extra = dict(ref_per_token_logps=p.ref_logps, old_per_token_logps=p.old_logps)
    their_loss, their_metrics = theirs(*args, **extra)
    our_loss, our_metrics = ours(*args, **extra)
    torch.testing.assert_close(our_loss, their_loss, rtol=1e-4, atol=1e-5)
    assert len(our_metrics) == len(their_metrics)
    for ours_m, theirs_m in zip(our_metrics, their_metrics):
        torch.testing.assert_close(ours_m.float(), theirs_m.float(), rtol=1e-4, atol=1e-5)
    if loss_type != "dapo":
        assert float(our_metrics[-1]) == 0.0
