"""FusedLinearGRPOLoss keeps Liger's constructor and forward, so swapping the import is the migration."""

import inspect
import warnings

import pytest
import torch
from grpo_testing import as_float64, assert_grad_close, assert_loss_close, make_problem

from grpo_kernels import FusedLinearGRPOLoss, GRPOLossConfig, fused_linear_grpo_loss, linear_logprobs, reference
from grpo_kernels.module import REF_INPUT_IGNORED_WARNING

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
                                      config=GRPOLossConfig(loss_type="bnpo", beta=beta, epsilon_high=0.28,
                                                            use_bias_correction_kl=False))
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
    with pytest.raises(ValueError, match="use_ref_model=True with beta != 0 needs ref_per_token_logps or ref_input"):
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


def test_constructor_defaults_are_liger_s():
    """The module keeps Liger's defaults (they differ from GRPOLossConfig's, which are TRL's)."""
    liger = pytest.importorskip("liger_kernel.chunked_loss")
    theirs = inspect.signature(liger.LigerFusedLinearGRPOLoss.__init__).parameters
    ours = inspect.signature(FusedLinearGRPOLoss.__init__).parameters
    for name, parameter in theirs.items():
        if name != "self":
            assert ours[name].default == parameter.default, name
    config = FusedLinearGRPOLoss().config
    assert (config.beta, config.use_bias_correction_kl, config.max_completion_length) == (0.04, False, None)


def _run_module(module, p, **forward_kwargs):
    leaves = {name: getattr(p, name).detach().clone().requires_grad_() for name in ("hidden", "weight", "bias")
              if getattr(p, name) is not None}
    loss, metrics = module(leaves["hidden"], leaves["weight"], p.completion_ids, p.completion_mask, p.advantages,
                           bias=leaves.get("bias"), old_per_token_logps=p.old_logps, **forward_kwargs)
    loss.backward()
    return loss, metrics, {name: leaf.grad for name, leaf in leaves.items()}


def _run_float64_reference(p, config, importance_ratio=None):
    p64 = as_float64(p)
    leaves = {name: getattr(p64, name).clone().requires_grad_() for name in ("hidden", "weight", "bias")
              if getattr(p64, name) is not None}
    out = reference.fused_linear_grpo_loss(
        leaves["hidden"], leaves["weight"], p64.completion_ids, p64.completion_mask, p64.advantages,
        bias=leaves.get("bias"), old_logps=p64.old_logps, ref_logps=p64.ref_logps if config.beta else None,
        importance_ratio=None if importance_ratio is None else importance_ratio.double(), config=config)
    out.loss.backward()
    return out, {name: leaf.grad for name, leaf in leaves.items()}


def _assert_matches_reference(loss, grads, ref_out, ref_grads, dtype=torch.float32):
    assert_loss_close(loss, ref_out.loss, dtype)
    for name, expected in ref_grads.items():
        assert_grad_close(grads[name], expected, dtype, f"d{name}")


@pytest.mark.parametrize("bias_corrected", [False, True])
def test_without_ref_model_the_kl_is_zero_and_reference_inputs_are_ignored(bias_corrected):
    """Liger: use_ref_model=False means no reference whatever is passed; with beta != 0 its KL (against the policy's
    own detached log-probs) is 0 in value and gradient, and the metric list still holds it."""
    p = make_problem(seed=11, B=3, T=5, H=16, V=40)
    module = FusedLinearGRPOLoss(beta=0.1, use_ref_model=False, use_bias_correction_kl=bias_corrected,
                                 loss_type="bnpo")
    ref_out, ref_grads = _run_float64_reference(
        p, GRPOLossConfig(loss_type="bnpo", beta=0.0, epsilon_high=0.2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Liger warns about both reference inputs only with use_ref_model=True
        for ref_inputs in ({}, dict(ref_per_token_logps=p.ref_logps),
                           dict(ref_per_token_logps=p.ref_logps, ref_input=p.hidden + 0.5, ref_weight=p.weight)):
            loss, (kl, clip_ratio), grads = _run_module(module, p, **ref_inputs)
            assert float(kl) == 0.0
            _assert_matches_reference(loss, grads, ref_out, ref_grads)
            assert_loss_close(clip_ratio, ref_out.metrics["clip_ratio/region_mean"], torch.float32, "clip ratio")


@pytest.mark.parametrize("loss_type", ["bnpo", "sapo"])
def test_vllm_is_ratio_of_one_per_sequence_or_token(loss_type):
    """[B], [B, 1] and [B, T] (the per-sequence ratio broadcast over the tokens) are the same correction."""
    p = make_problem(seed=12, B=3, T=5, H=16, V=40)
    per_sequence = torch.tensor([0.6, 1.3, 0.9])
    module = FusedLinearGRPOLoss(beta=0.04, loss_type=loss_type, epsilon_high=0.28)
    config = GRPOLossConfig(loss_type=loss_type, beta=0.04, epsilon_high=0.28, use_bias_correction_kl=False)
    ref_out, ref_grads = _run_float64_reference(p, config, importance_ratio=per_sequence[:, None].expand(3, 5))
    for ratio in (per_sequence, per_sequence[:, None], per_sequence[:, None].expand(3, 5).contiguous()):
        loss, (kl, _), grads = _run_module(module, p, ref_per_token_logps=p.ref_logps, vllm_is_ratio=ratio)
        _assert_matches_reference(loss, grads, ref_out, ref_grads)
        assert_loss_close(kl, ref_out.metrics["kl"], torch.float32, "kl")


@pytest.mark.parametrize("shape", [(2,), (3, 2), (3, 5, 1), (15,)])
def test_vllm_is_ratio_of_another_shape_is_refused(shape):
    p = make_problem(seed=13, B=3, T=5, H=16, V=40)
    with pytest.raises(ValueError, match=r"vllm_is_ratio must have shape \[B\]=\[3\], \[B, 1\]=\[3, 1\] or "):
        FusedLinearGRPOLoss(beta=0.0)(p.hidden, p.weight, p.completion_ids, p.completion_mask, p.advantages,
                                      vllm_is_ratio=torch.ones(shape))


def test_both_reference_inputs_warn_as_liger_and_the_log_probs_win():
    p = make_problem(seed=14, B=2, T=4, H=16, V=40)
    module = FusedLinearGRPOLoss(beta=0.04)
    ref_out, ref_grads = _run_float64_reference(
        p, GRPOLossConfig(beta=0.04, epsilon_high=0.2, use_bias_correction_kl=False))
    with pytest.warns(UserWarning) as caught:
        loss, (kl, _), grads = _run_module(module, p, ref_per_token_logps=p.ref_logps, ref_input=p.hidden + 0.5,
                                           ref_weight=p.weight)
    assert [str(w.message) for w in caught] == [REF_INPUT_IGNORED_WARNING]
    assert REF_INPUT_IGNORED_WARNING == "Both ref_per_token_logps and ref_input are provided. Using ref_per_token_logps."
    _assert_matches_reference(loss, grads, ref_out, ref_grads)
    assert_loss_close(kl, ref_out.metrics["kl"], torch.float32, "kl")
