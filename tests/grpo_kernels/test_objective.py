"""The spec itself, checked by hand on small cases whose answers are worked out in the comments."""

import dataclasses
import math
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_kernels import GRPOLossConfig, grpo_objective
from grpo_kernels.objective import nanquantile


def _objective(lp, mask, adv, config, **kwargs):
    lp = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
    ent = torch.zeros_like(lp)
    loss, metrics = grpo_objective(lp, ent, torch.tensor(mask, dtype=torch.float64),
                                   torch.tensor(adv, dtype=torch.float64), config, **kwargs)
    loss.backward()
    return loss.item(), lp.grad, metrics


def _t(x):
    return torch.tensor(x, dtype=torch.float64)


def test_on_policy_dapo_is_minus_mean_advantage_and_gradient_of_lp():
    # ratio 1 everywhere: L = -A per token; dapo sums over 3 valid tokens and divides by 3
    loss, grad, metrics = _objective([[-1.0, -2.0, -3.0], [-0.5, -0.1, -9.0]], [[1, 1, 0], [1, 0, 0]], [2.0, -1.0],
                                     GRPOLossConfig())
    assert loss == pytest.approx(-(2 + 2 - 1) / 3)
    torch.testing.assert_close(grad, _t([[-2 / 3, -2 / 3, 0], [1 / 3, 0, 0]]))
    assert float(metrics["clip_ratio/region_mean"]) == 0.0


def test_ppo_clip_and_delta_cap():
    # r = exp(log 1.5) = 1.5, eps 0.2. A=+1: min(1.5, 1.2) = 1.2 -> clipped, no gradient.
    # A=-1: min(-1.5, -1.2) = -1.5 -> L = 1.5, dL/dlp = -A * r = 1.5. With delta=1.4: r' = 1.4 -> L = 1.4, grad 0.
    old = _t([[0.0], [0.0]])
    lp = [[math.log(1.5)], [math.log(1.5)]]
    loss, grad, metrics = _objective(lp, [[1], [1]], [1.0, -1.0], GRPOLossConfig(loss_type="bnpo"), old_logps=old)
    assert loss == pytest.approx((-1.2 + 1.5) / 2)
    torch.testing.assert_close(grad, _t([[0.0], [1.5 / 2]]))
    assert float(metrics["clip_ratio/high_mean"]) == 0.5 and float(metrics["clip_ratio/low_mean"]) == 0.0
    loss, grad, _ = _objective(lp, [[1], [1]], [1.0, -1.0], GRPOLossConfig(loss_type="bnpo", delta=1.4), old_logps=old)
    assert loss == pytest.approx((-1.2 + 1.4) / 2)
    torch.testing.assert_close(grad, _t([[0.0], [0.0]]))


def test_k3_kl_and_bias_correction():
    # lp = -1, ref = -2: kl = exp(-1) - (-1) - 1 = e^-1; on policy, A = 0, loss = beta * kl
    loss, grad, metrics = _objective([[-1.0]], [[1]], [0.0], GRPOLossConfig(beta=0.5, use_bias_correction_kl=False),
                                     ref_logps=_t([[-2.0]]))
    assert loss == pytest.approx(0.5 * math.exp(-1))
    assert float(metrics["kl"]) == pytest.approx(math.exp(-1))
    # d kl / d lp = -exp(ref - lp) + 1
    torch.testing.assert_close(grad, _t([[0.5 * (1 - math.exp(-1))]]))
    # bias-corrected: kl * r with r = 1 in value but its gradient is that of lp: extra + beta * kl
    _, grad_bc, _ = _objective([[-1.0]], [[1]], [0.0], GRPOLossConfig(beta=0.5, use_bias_correction_kl=True),
                               ref_logps=_t([[-2.0]]))
    torch.testing.assert_close(grad_bc, _t([[0.5 * (1 - math.exp(-1)) + 0.5 * math.exp(-1)]]))


def test_sequence_level_ratio_is_length_normalised():
    # d = [0.2, 0.4, (padding 5.0)] -> r = exp(0.3) for both valid tokens; grpo, A = 1, eps_high = 1 (no clip)
    lp = [[0.2, 0.4, 5.0]]
    config = GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence", epsilon_high=1.0)
    loss, grad, _ = _objective(lp, [[1, 1, 0]], [1.0], config, old_logps=_t([[0.0, 0.0, 0.0]]))
    assert loss == pytest.approx(-math.exp(0.3))
    torch.testing.assert_close(grad, _t([[-math.exp(0.3) / 2, -math.exp(0.3) / 2, 0.0]]))


def test_luspo_sums_each_sequence_then_averages():
    # TRL 1.16: mean over sequences of sum_t m L; the padded position does not count
    loss, grad, _ = _objective([[-1.0, -1.0], [-1.0, -1.0]], [[1, 0], [1, 1]], [1.0, 2.0],
                               GRPOLossConfig(loss_type="luspo", importance_sampling_level="sequence"))
    assert loss == pytest.approx((-1 * 1 + -2 * 2) / 2)
    torch.testing.assert_close(grad, _t([[-0.5, 0.0], [-1.0, -1.0]]))


def test_cispo_weight_is_detached_and_capped():
    # r = e^1 > eps_high = 2: L = -2 * A * lp, dL/dlp = -2 A
    loss, grad, metrics = _objective([[1.0]], [[1]], [3.0], GRPOLossConfig(loss_type="cispo", epsilon_high=2.0),
                                     old_logps=_t([[0.0]]))
    assert loss == pytest.approx(-2 * 3 * 1.0)
    torch.testing.assert_close(grad, _t([[-6.0]]))
    assert float(metrics["clip_ratio/region_mean"]) == 1.0


def test_sapo_soft_gate():
    # r = 1: L = -(4/k) sigmoid(0) A = -(2/k) A, dL/dlp = -(4/k) * k * s(0)(1 - s(0)) * A = -A, then / 2 sequences
    loss, grad, _ = _objective([[0.0], [0.0]], [[1], [1]], [1.0, -1.0], GRPOLossConfig(loss_type="sapo"),
                               old_logps=_t([[0.0], [0.0]]))
    assert loss == pytest.approx(((-2 / 1.0) * 1 + (-2 / 1.05) * -1) / 2)
    torch.testing.assert_close(grad, _t([[-0.5], [0.5]]))


def test_vespo_weight():
    # on policy: lw = 0, w = 1, phi = exp(lam + 0 - lam) = 1 -> L = -A lp, dL/dlp = -A (dapo-normalised)
    loss, grad, _ = _objective([[-2.0, -1.0]], [[1, 1]], [0.5], GRPOLossConfig(loss_type="vespo"))
    assert loss == pytest.approx(-0.5 * (-3.0) / 2)
    torch.testing.assert_close(grad, _t([[-0.25, -0.25]]))


def test_vespo_clamps_each_token_importance_ratio_as_trl():
    # TRL's get_gamma_weights: log w = sum_t clamp(log rho_t, log 1e-8, 20) + sum_t m d_t, then clamped again.
    # rho = (0, e^15) on policy: log w = -18.42 + 15 = -3.42, phi = exp(lam + k log w - lam w) with A >= 0 (k 2,
    # lam 3); a ratio at a masked position (0 here, whose log is -inf) is left out.
    config = GRPOLossConfig(loss_type="vespo")
    log_w = math.log(1e-8) + 15.0
    phi = math.exp(3.0 + 2.0 * log_w - 3.0 * math.exp(log_w))
    loss, grad, _ = _objective([[-2.0, -1.0, -4.0]], [[1, 1, 0]], [0.5], config,
                               importance_ratio=_t([[0.0, math.exp(15.0), 0.0]]))
    assert loss == pytest.approx(-phi * 0.5 * (-3.0) / 2, rel=1e-9)
    torch.testing.assert_close(grad, _t([[-phi * 0.25, -phi * 0.25, 0.0]]))


def test_entropy_bonus_and_entropy_mask():
    lp = torch.zeros(1, 4, dtype=torch.float64, requires_grad=True)
    ent = torch.tensor([[0.1, 0.9, 0.5, 0.7]], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(1, 4, dtype=torch.float64)
    config = GRPOLossConfig(loss_type="bnpo", entropy_coef=0.1, top_entropy_quantile=0.5)
    loss, _ = grpo_objective(lp, ent, mask, torch.tensor([1.0], dtype=torch.float64), config)
    loss.backward()
    # the top half by entropy (0.9, 0.7) keep their -A term; as in TRL the bonus is -0.1 times the mean
    # entropy of the tokens it acts on (the same two)
    assert loss.item() == pytest.approx(-2 / 4 - 0.1 * (0.9 + 0.7) / 2)
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, -0.25, 0.0, -0.25]], dtype=torch.float64))
    torch.testing.assert_close(ent.grad, torch.tensor([[0.0, -0.05, 0.0, -0.05]], dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_entropy_threshold_is_torch_nanquantile_value_for_value(dtype):
    # the mask's threshold avoids torch.nanquantile only so that torch.compile traces it (torch 2.11's breaks the
    # graph); it must give the same number: ties, padding (NaN), nothing valid, and the end quantiles
    gen = torch.Generator().manual_seed(0)
    for case in range(300):
        values = (3 * torch.randn(int(torch.randint(1, 40, (1,), generator=gen)), generator=gen, dtype=dtype))
        values = values.round() if case % 2 else values
        values[torch.rand(values.shape, generator=gen) < case / 300] = float("nan")
        for q in (0.0, 1.0, float(torch.rand(1, generator=gen))):
            expected = torch.nanquantile(values, q)
            actual = nanquantile(values.view(-1, 1), q)
            assert actual.dtype == dtype and actual.shape == ()
            assert torch.equal(actual, expected) or (actual.isnan() and expected.isnan()), (case, q, actual, expected)
    assert nanquantile(torch.full((3, 2), float("nan"), dtype=dtype), 0.5).isnan()  # nothing valid


def test_entropy_bonus_is_a_token_mean_for_every_loss_type():
    # dapo normalises its policy term by num_items_in_batch (10) but the bonus stays a mean over 2 tokens
    lp = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    ent = torch.tensor([[1.0, 3.0]], dtype=torch.float64)
    loss, _ = grpo_objective(lp, ent, torch.ones(1, 2, dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64),
                             GRPOLossConfig(entropy_coef=0.5), num_items_in_batch=10)
    assert loss.item() == pytest.approx(-2 / 10 - 0.5 * 2.0)


def test_importance_ratio_weights_tokens_and_num_items_normalises():
    loss, grad, _ = _objective([[0.0, 0.0]], [[1, 1]], [1.0], GRPOLossConfig(), importance_ratio=_t([[0.5, 2.0]]),
                               num_items_in_batch=10)
    assert loss == pytest.approx(-(0.5 + 2.0) / 10)
    torch.testing.assert_close(grad, _t([[-0.05, -0.2]]))


def test_dr_grpo_divides_by_batch_times_max_length():
    loss, _, _ = _objective([[0.0, 0.0], [0.0, 0.0]], [[1, 1], [1, 0]], [1.0, 1.0],
                            GRPOLossConfig(loss_type="dr_grpo", max_completion_length=4))
    assert loss == pytest.approx(-3 / (2 * 4))


def test_from_trl_reads_matching_attribute_names():
    class TRLArgs:
        loss_type, beta, epsilon, epsilon_high, temperature, learning_rate = "grpo", 0.04, 0.3, 0.28, 0.9, 1e-6

    config = GRPOLossConfig.from_trl(TRLArgs())
    assert (config.loss_type, config.beta, config.epsilon, config.epsilon_high_value, config.temperature) == (
        "grpo", 0.04, 0.3, 0.28, 0.9)


@settings(max_examples=40, deadline=None)
@given(values=st.fixed_dictionaries({}, optional={"loss_type": st.sampled_from(["grpo", "dapo", "bnpo"]),
                                                  "beta": st.sampled_from([0.0, 0.04, 0.5]),
                                                  "epsilon": st.sampled_from([0.1, 0.3]),
                                                  "temperature": st.sampled_from([0.7, 1.3])}),
       unrelated=st.dictionaries(st.sampled_from(["learning_rate", "output_dir", "seed"]), st.integers(0, 9)),
       carrier=st.sampled_from(["object", "dict"]))
def test_from_trl_reads_an_object_or_a_mapping_and_refuses_one_with_none_of_the_names(values, unrelated, carrier):
    """TRL's arguments as an object or as a mapping (GRPOConfig.to_dict(), a loaded YAML) give the same config; one
    holding none of GRPOConfig's names (a dict read by attribute, None, the wrong object) is refused, not read as
    the defaults."""
    given = {**unrelated, **values}
    source = type("TRLArgs", (), given)() if carrier == "object" else given
    if not values:
        with pytest.raises(TypeError, match=r"^GRPOLossConfig.from_trl takes a trl.GRPOConfig.*has none of them$"):
            GRPOLossConfig.from_trl(source)
        return
    assert GRPOLossConfig.from_trl(source) == GRPOLossConfig(**values)


def _trl_names() -> set[str]:
    try:
        import dataclasses
        from trl import GRPOConfig
    except ImportError:  # the oldest stack has no TRL
        return set()
    return {f.name for f in dataclasses.fields(GRPOConfig)}


# TRL's own arguments of GRPOConfig near a setting's name (entropy_coef_min) are not typos: drawn where TRL has them
UNRELATED = ["learning_rate", "output_dir", "seed", *sorted({"entropy_coef_min"} & _trl_names())]
FROM_TRL_NAMES = ["loss_type", "beta", "epsilon", "epsilon_high", "delta", "importance_sampling_level", "temperature",
                  "max_completion_length", "entropy_coef", "top_entropy_quantile"]


def _carried(given: dict, carrier: str) -> object:
    """`given` as a mapping, a namespace, a dataclass with __slots__ (no __dict__), class attributes or properties."""
    if carrier == "dict":
        return given
    if carrier == "namespace":
        return types.SimpleNamespace(**given)
    if carrier == "slots":
        return dataclasses.make_dataclass("Args", list(given), slots=True)(**given)
    if carrier == "class":
        return type("Args", (), dict(given))()
    return type("Args", (), {key: property(lambda self, value=value: value) for key, value in given.items()})()


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(FROM_TRL_NAMES), at=st.integers(0, 30),
       carrier=st.sampled_from(["dict", "namespace", "slots", "class", "property"]),
       unrelated=st.dictionaries(st.sampled_from(UNRELATED), st.integers(0, 9)))
def test_from_trl_refuses_a_misspelt_name_naming_it(name, at, carrier, unrelated):
    """A key one letter short of a setting's name (`epsilon_hgh`) in a mapping or a plain namespace was left out, and
    the setting kept its default, silently; it is refused naming the key. TRL's own other names are not. An object
    read by attribute is read whole: a dataclass with __slots__, class attributes and properties were missed."""
    typo = name[:at % len(name)] + name[at % len(name) + 1:]
    given = {**unrelated, "beta": 0.04, typo: 0.5}
    source = _carried(given, carrier)
    with pytest.raises(TypeError, match=rf"^GRPOLossConfig.from_trl: '{typo}' is no argument .*did you mean '"):
        GRPOLossConfig.from_trl(source)
    assert GRPOLossConfig.from_trl({**unrelated, "beta": 0.04}) == GRPOLossConfig(beta=0.04)


@pytest.mark.parametrize("source", [None, 0.04, "dapo", [("beta", 0.04)]])
def test_from_trl_refuses_what_is_no_set_of_arguments(source):
    with pytest.raises(TypeError, match="has none of them"):
        GRPOLossConfig.from_trl(source)
