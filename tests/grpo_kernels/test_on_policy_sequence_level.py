"""GSPO's sequence-level ratio on-policy (no old log-probs) takes the token-level route: the same loss, metrics and
gradients as the sequence-level spec, by one pass on the GEMM path (objective.on_policy_token_level)."""

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, grpo_objective, ops, reference
from grpo_kernels.config import LossConfigWarning
from grpo_kernels.losses import BUILTIN_LOSS_TYPES, get_loss_type, register_loss_type, unregister_loss_type
from grpo_kernels.objective import on_policy_token_level
from tests.support.grpo_testing import (as_float64, assert_grad_close, assert_loss_close, assert_output_matches,
                                        make_problem, run_loss)

# the built-in types whose on-policy sequence ratio trains as the per-token one
CONVERTIBLE = [name for name in BUILTIN_LOSS_TYPES
               if get_loss_type(name).token_level and get_loss_type(name).ratio_slope_per_sequence]


def _config(**kwargs) -> GRPOLossConfig:
    with warnings.catch_warnings():  # GSPO's level with a token-normalised type warns, as TRL does
        warnings.simplefilter("ignore", LossConfigWarning)
        return GRPOLossConfig(importance_sampling_level="sequence", **kwargs)


def _spec(config, lp, ent, mask, adv, **kwargs):
    """grpo_objective's loss, metrics and (dlp, dent) in float64."""
    lp, ent = lp.clone().requires_grad_(), ent.clone().requires_grad_()
    loss, metrics = grpo_objective(lp, ent, mask, adv, config, **kwargs)
    g_lp, g_ent = torch.autograd.grad(loss, (lp, ent), allow_unused=True)
    return loss.detach(), {k: v.detach() for k, v in metrics.items()}, g_lp, \
        torch.zeros_like(ent) if g_ent is None else g_ent


def _batch(seed: int, B: int, T: int, per_token_advantages: bool = False):
    gen = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 4
    ent = torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    mask = (torch.rand(B, T, generator=gen) > 0.3).double()
    mask[0] = 0.0  # a sequence with no valid token
    if B > 1:
        mask[1, 0] = 1.0
    adv = torch.randn((B, T) if per_token_advantages else (B,), generator=gen, dtype=torch.float64)
    ref = lp + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    return lp, ent, mask, adv, ref


def _converted(config):
    return on_policy_token_level(config, on_policy=True, importance_ratio=False, advantages_per_sequence=True)


def _assert_same(a, b):
    (loss_a, metrics_a, g_a, e_a), (loss_b, metrics_b, g_b, e_b) = a, b
    torch.testing.assert_close(loss_a, loss_b, atol=1e-12, rtol=1e-12)
    assert set(metrics_a) == set(metrics_b)
    for name in metrics_a:
        torch.testing.assert_close(metrics_a[name].double(), metrics_b[name].double(), atol=1e-12, rtol=1e-12,
                                   msg=lambda m: f"metric {name}: {m}")
    torch.testing.assert_close(g_a, g_b, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(e_a, e_b, atol=1e-12, rtol=1e-12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(loss_type=st.sampled_from(CONVERTIBLE), seed=st.integers(0, 2 ** 31 - 1), B=st.integers(1, 5),
       T=st.integers(1, 7), beta=st.sampled_from([0.0, 0.04, 0.5]), entropy_coef=st.sampled_from([0.0, 0.01]),
       epsilon=st.sampled_from([0.0, 0.2, 3e-4]), epsilon_high=st.sampled_from([None, 0.28, 4e-4, 5.0]),
       delta=st.sampled_from([None, 1.5]), num_items=st.sampled_from([None, 17]))
def test_converted_config_gives_the_sequence_level_spec(loss_type, seed, B, T, beta, entropy_coef, epsilon,
                                                         epsilon_high, delta, num_items):
    config = _config(loss_type=loss_type, beta=beta, entropy_coef=entropy_coef, epsilon=epsilon,
                     epsilon_high=epsilon_high, delta=delta, use_bias_correction_kl=False,
                     max_completion_length=T if loss_type == "dr_grpo" else None)
    converted = _converted(config)
    clipped_at_one = get_loss_type(loss_type).clip == "ratio_cap" and config.epsilon_high_value < 1.0
    assert converted.importance_sampling_level == ("sequence" if clipped_at_one else "token")
    lp, ent, mask, adv, ref = _batch(seed, B, T)
    kwargs = dict(ref_logps=ref, num_items_in_batch=num_items)
    _assert_same(_spec(converted, lp, ent, mask, adv, **kwargs), _spec(config, lp, ent, mask, adv, **kwargs))


# Each condition the conversion checks, and inputs on which ignoring it would change the gradient.
GUARDED = {
    "old log-probs": (dict(), dict(old_logps=True)),
    "per-token rho": (dict(), dict(importance_ratio=True)),
    "per-token advantages": (dict(), dict(per_token_advantages=True)),
    "entropy mask": (dict(top_entropy_quantile=0.5), dict()),
    "bias-corrected KL": (dict(beta=0.5, use_bias_correction_kl=True), dict()),
}


@pytest.mark.parametrize("case", list(GUARDED))
def test_each_guard_is_needed_and_kept(case):
    settings_, inputs = GUARDED[case]
    config = _config(loss_type="grpo", **settings_)
    lp, ent, mask, adv, ref = _batch(3, 4, 6, per_token_advantages=inputs.get("per_token_advantages", False))
    gen = torch.Generator().manual_seed(7)
    old = lp + 0.2 * torch.randn(lp.shape, generator=gen, dtype=torch.float64) if inputs.get("old_logps") else None
    rho = 0.5 + torch.rand(lp.shape, generator=gen, dtype=torch.float64) if inputs.get("importance_ratio") else None
    kwargs = dict(ref_logps=ref, old_logps=old, importance_ratio=rho)
    assert on_policy_token_level(config, on_policy=old is None, importance_ratio=rho is not None,
                                 advantages_per_sequence=adv.dim() == 1) is config
    token = GRPOLossConfig(**{**{k: getattr(config, k) for k in ("loss_type", "beta", "use_bias_correction_kl",
                                                                 "top_entropy_quantile")}})
    with pytest.raises(AssertionError):  # the token-level config would train differently on these inputs
        _assert_same(_spec(token, lp, ent, mask, adv, **kwargs), _spec(config, lp, ent, mask, adv, **kwargs))


def test_a_clip_flag_at_ratio_one_keeps_the_sequence_level():
    config = _config(loss_type="cispo", epsilon_high=0.5)  # r = 1 > 0.5: every positive advantage reads as capped
    assert _converted(config) is config


def test_a_registered_type_converts_only_when_it_declares_so():
    def slope_reads_lp(x):  # dL/dr at r = 1 is -A lp: its own token's
        return -x.ratio * x.advantages * x.logps

    try:
        register_loss_type("slope_reads_lp", slope_reads_lp, "sequence_mean", token_level=True)
        register_loss_type("own_weights", lambda x: -x.ratio * x.advantages, lambda m, c, n: m * torch.arange(
            1, m.shape[-1] + 1, dtype=m.dtype), token_level=True, ratio_slope_per_sequence=True)
        register_loss_type("declared_ppo", get_loss_type("grpo").term, "sequence_mean", token_level=True,
                           ratio_slope_per_sequence=True)
        for name in ("slope_reads_lp", "own_weights"):
            config = _config(loss_type=name)
            assert _converted(config) is config, name
            lp, ent, mask, adv, _ = _batch(5, 3, 5)
            token = GRPOLossConfig(loss_type=name)
            with pytest.raises(AssertionError):  # the declaration is what keeps these right
                _assert_same(_spec(token, lp, ent, mask, adv), _spec(config, lp, ent, mask, adv))
        config = _config(loss_type="declared_ppo")
        converted = _converted(config)
        assert converted.importance_sampling_level == "token"
        lp, ent, mask, adv, _ = _batch(6, 3, 5)
        _assert_same(_spec(converted, lp, ent, mask, adv), _spec(config, lp, ent, mask, adv))
    finally:
        for name in ("slope_reads_lp", "own_weights", "declared_ppo"):
            unregister_loss_type(name)


@pytest.mark.parametrize("packed", [False, True])
def test_on_policy_gspo_runs_in_one_pass_on_the_gemm_path(monkeypatch, packed):
    calls = []
    one_pass = ops.one_pass_token_level
    monkeypatch.setattr(ops, "one_pass_token_level", lambda *a, **k: calls.append(1) or one_pass(*a, **k))
    config = _config(loss_type="grpo", beta=0.04, use_bias_correction_kl=False, epsilon=3e-4, epsilon_high=4e-4)
    problem = make_problem(11, B=4, T=6, H=24, V=300, with_old=False)
    ref_out, ref_grads = run_loss(reference.fused_linear_grpo_loss, as_float64(problem), config)
    if not packed:
        out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend="gemm")
        assert_output_matches(out, grads, ref_out, ref_grads, torch.float32)
    else:  # the valid positions of each row back to back, one advantage a sequence
        mask = problem.completion_mask.bool()
        lengths = mask.sum(-1)
        packed_problem = type(problem)(
            hidden=problem.hidden[mask], weight=problem.weight, bias=problem.bias,
            completion_ids=problem.completion_ids[mask], completion_mask=torch.ones(int(lengths.sum())),
            advantages=problem.advantages, old_logps=None, ref_logps=problem.ref_logps[mask], importance_ratio=None)
        out, grads = run_loss(fused_linear_grpo_loss, packed_problem, config, backend="gemm",
                              cu_seqlens=torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]))
        assert_loss_close(out.loss, ref_out.loss, torch.float32)
        for name, value in ref_out.metrics.items():
            assert_loss_close(out.metrics[name], value, torch.float32, what=f"metric {name}")
        assert_grad_close(grads["hidden"], ref_grads["hidden"][mask], torch.float32, "dhidden")
        for name in ("weight", "bias"):
            assert_grad_close(grads[name], ref_grads[name], torch.float32, f"d{name}")
    assert calls, "the on-policy GSPO call did not take the one-pass route"

    calls.clear()  # off-policy: the sequence-level route, two passes
    run_loss(fused_linear_grpo_loss, make_problem(11, B=4, T=6, H=24, V=300), config, backend="gemm")
    assert not calls
