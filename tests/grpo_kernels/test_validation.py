"""Bad input fails before any kernel runs, with an error that names the argument."""

import dataclasses
import warnings

import pytest
import torch
from grpo_testing import make_problem, with_triton_interpreted

from grpo_kernels import GRPOLossConfig, LogitTransform, fused_linear_grpo_loss, grpo_loss_from_logits, linear_logprobs

BACKENDS = with_triton_interpreted(["torch", "triton", "reference"])


def _call(backend, **overrides):
    p = make_problem(seed=0, B=2, T=3, H=8, V=20)
    kwargs = dict(hidden=p.hidden, weight=p.weight, completion_ids=p.completion_ids,
                  completion_mask=p.completion_mask, advantages=p.advantages, bias=p.bias)
    config = overrides.pop("config", GRPOLossConfig())
    kwargs.update(overrides)
    return fused_linear_grpo_loss(config=config, backend=backend, **kwargs)


CASES = [
    ("hidden rank", dict(hidden=torch.randn(6, 8)), ValueError, "hidden must be \\[B, T, H\\]"),
    ("H mismatch", dict(weight=torch.randn(20, 9)), ValueError, "hidden size mismatch"),
    ("weight rank", dict(weight=torch.randn(20, 8, 1)), ValueError, "weight must be \\[V, H\\]"),
    ("float ids", dict(completion_ids=torch.zeros(2, 3)), TypeError, "completion_ids must be an integer tensor"),
    ("ids too big", dict(completion_ids=torch.full((2, 3), 20)), ValueError,
     "completion_ids must hold token ids in \\[0, 20\\)"),
    ("negative ids", dict(completion_ids=torch.full((2, 3), -1)), ValueError, "completion_ids must hold token ids"),
    ("ids shape", dict(completion_ids=torch.zeros(2, 4, dtype=torch.long)), ValueError,
     "completion_ids must have shape"),
    ("nan hidden", dict(hidden=torch.full((2, 3, 8), float("nan"))), ValueError, "hidden contains NaN or Inf"),
    ("inf weight", dict(weight=torch.full((20, 8), float("inf"))), ValueError, "weight contains NaN or Inf"),
    ("mask values", dict(completion_mask=torch.full((2, 3), 2)), ValueError, "completion_mask values must be 0 or 1"),
    ("mask shape", dict(completion_mask=torch.ones(2, 4)), ValueError, "completion_mask must have shape"),
    ("advantages shape", dict(advantages=torch.ones(3)), ValueError, "advantages must have shape"),
    ("nan advantages", dict(advantages=torch.tensor([1.0, float("nan")])), ValueError, "advantages contains NaN"),
    ("weight dtype", dict(weight=torch.randn(20, 8, dtype=torch.float64)), TypeError, "weight dtype"),
    ("int hidden", dict(hidden=torch.ones(2, 3, 8, dtype=torch.long)), TypeError, "hidden must be a floating tensor"),
    ("bias shape", dict(bias=torch.randn(19)), ValueError, "bias must have shape"),
    ("transform type", dict(logit_transform=30.0), TypeError, "logit_transform must be a grpo_kernels.LogitTransform"),
    ("old_logps shape", dict(old_logps=torch.zeros(2, 2)), ValueError, "old_logps must have shape"),
    ("rho shape", dict(importance_ratio=torch.ones(2, 2)), ValueError, "importance_ratio must have shape"),
    ("negative rho", dict(importance_ratio=-torch.ones(2, 3)), ValueError, "importance_ratio must be >= 0"),
    ("beta without ref", dict(config=GRPOLossConfig(beta=0.1)), ValueError, "needs ref_logps"),
    ("num items", dict(num_items_in_batch=-3), ValueError, "num_items_in_batch"),
    ("vespo sequence rho", dict(config=GRPOLossConfig(loss_type="vespo"), importance_ratio=torch.ones(2, 1)),
     ValueError, "vespo' needs a per-token importance_ratio"),
    ("not a tensor", dict(hidden=[[1.0]]), TypeError, "hidden must be a torch.Tensor"),
    ("config type", dict(config={"loss_type": "dapo"}), TypeError, "config must be a GRPOLossConfig"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,overrides,error,message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_named(backend, name, overrides, error, message):
    with pytest.raises(error, match=message):
        _call(backend, **overrides)


def test_unknown_backend():
    with pytest.raises(ValueError, match="backend must be one of"):
        _call("cuda-magic")


@pytest.mark.parametrize("kwargs,message", [
    (dict(loss_type="ppo"), "loss_type must be one of"),
    (dict(importance_sampling_level="group"), "importance_sampling_level must be one of"),
    (dict(loss_type="dr_grpo", max_completion_length=None), "needs max_completion_length"),
    (dict(temperature=0.0), r"temperature must be in \[1e-30, 1e\+30\]"),
    (dict(temperature=3e38), r"temperature must be in \[1e-30, 1e\+30\]"),
    (dict(top_entropy_quantile=0.0), "top_entropy_quantile must be in"),
    (dict(delta=0.9), "delta must be > 1"),
    (dict(beta=float("nan")), "beta must be a finite number"),
    (dict(max_completion_length=0), "max_completion_length must be a positive int"),
])
def test_config_rejects(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        GRPOLossConfig(**kwargs)


def test_combinations_trl_warns_about_warn_here_too():
    with pytest.warns(UserWarning, match="luspo"):
        GRPOLossConfig(loss_type="luspo")
    with pytest.warns(UserWarning, match="GSPO uses loss_type='grpo'"):
        GRPOLossConfig(loss_type="dapo", importance_sampling_level="sequence")


@pytest.mark.parametrize("make", [
    lambda: GRPOLossConfig(loss_type="luspo"),
    lambda: GRPOLossConfig(loss_type="bnpo", importance_sampling_level="sequence"),
    lambda: dataclasses.replace(GRPOLossConfig(), loss_type="luspo"),
])
def test_config_warnings_point_at_the_callers_line(make):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make()
    (warning,) = caught
    # Not `<string>` (the dataclass's generated __init__) nor a line of grpo_kernels: the line that built it.
    assert (warning.filename, warning.lineno) == (__file__, make.__code__.co_firstlineno)


def test_wrong_device_mix_is_named():
    """A meta hidden is named as such (it has no values), not as a device mismatch of the weight beside it."""
    meta = torch.empty(2, 3, 8, device="meta")
    with pytest.raises(ValueError, match="hidden is on the meta device"):
        linear_logprobs(meta, torch.randn(20, 8), torch.zeros(2, 3, dtype=torch.long), backend="torch")
    with pytest.raises(ValueError, match="weight is on meta but hidden is on cpu"):
        linear_logprobs(torch.randn(2, 3, 8), torch.empty(20, 8, device="meta"), torch.zeros(2, 3, dtype=torch.long),
                        backend="torch")


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_input_checks(backend):
    with pytest.raises(ValueError, match="logits must be \\[B, T, V\\]"):
        grpo_loss_from_logits(torch.randn(6, 20), torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3),
                              torch.ones(2), backend=backend)
    with pytest.raises(ValueError, match="completion_ids must hold token ids in \\[0, 20\\)"):
        grpo_loss_from_logits(torch.randn(2, 3, 20), torch.full((2, 3), 25), torch.ones(2, 3), torch.ones(2),
                              backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_are_not_modified(backend):
    p = make_problem(seed=1, B=2, T=3, H=8, V=20, importance_ratio="token")
    tensors = dict(hidden=p.hidden, weight=p.weight, bias=p.bias, ids=p.completion_ids, mask=p.completion_mask,
                   adv=p.advantages, old=p.old_logps, ref=p.ref_logps, rho=p.importance_ratio)
    before = {k: v.clone() for k, v in tensors.items()}
    hidden = p.hidden.clone().requires_grad_()
    out = fused_linear_grpo_loss(hidden, p.weight, p.completion_ids, p.completion_mask, p.advantages, bias=p.bias,
                                 old_logps=p.old_logps, ref_logps=p.ref_logps, importance_ratio=p.importance_ratio,
                                 config=GRPOLossConfig(beta=0.04), backend=backend)
    out.loss.backward()
    for k, v in tensors.items():
        assert torch.equal(v, before[k]), f"{k} was modified in place"


@pytest.mark.parametrize("kwargs,message", [
    (dict(softcap=0.0), "LogitTransform.softcap must be > 0"),
    (dict(softcap=-30.0), "LogitTransform.softcap must be > 0"),
    (dict(softcap=float("inf")), "LogitTransform.softcap must be a finite real number"),
    (dict(scale=float("nan")), "LogitTransform.scale must be a finite real number"),
    (dict(scale="1/8"), "LogitTransform.scale must be a finite real number"),
    (dict(scale=True), "LogitTransform.scale must be a finite real number"),
])
def test_logit_transform_values_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LogitTransform(**kwargs)


# ---- the finiteness check: one reduction per tensor, exact for every dtype ----------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from grpo_kernels.validation import check_linear_inputs  # noqa: E402

_FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(_FLOATS), which=st.sampled_from(["hidden", "weight", "bias"]),
       bad=st.sampled_from([float("nan"), float("inf"), -float("inf"), None]), position=st.integers(0, 10_000),
       near_limit=st.booleans())
def test_a_non_finite_element_anywhere_is_named_and_the_largest_finite_values_pass(dtype, which, bad, position,
                                                                                     near_limit):
    tensors = {"hidden": torch.randn(5, 7).to(dtype), "weight": torch.randn(11, 7).to(dtype),
               "bias": torch.randn(11).to(dtype)}
    target = tensors[which].view(-1)
    if near_limit:  # the dtype's largest finite magnitude, both signs: finite, so not refused as NaN or Inf
        target[position % target.numel()] = torch.finfo(dtype).max
        target[(position + 1) % target.numel()] = -torch.finfo(dtype).max
    if bad is not None:
        target[(position + 2) % target.numel()] = bad
        with pytest.raises(ValueError, match=f"^{which} contains NaN or Inf values$"):
            check_linear_inputs(tensors["hidden"], tensors["weight"], tensors["bias"])
        return
    largest = {name: float(t.double().abs().max()) for name, t in tensors.items()}
    logits_bound = 7 * largest["hidden"] * largest["weight"] + largest["bias"]
    if logits_bound > torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).max / 4:
        # but logits that large would overflow the dtype the logits are computed in: refused as such
        with pytest.raises(ValueError, match="^hidden and weight are too large for the logits'"):
            check_linear_inputs(tensors["hidden"], tensors["weight"], tensors["bias"])
    else:
        check_linear_inputs(tensors["hidden"], tensors["weight"], tensors["bias"])
