"""A registered loss type is checked, not trusted: its term's shape and dtype, padded positions kept out of the
loss and every gradient by selection, its own declared hyper-parameters, and no silent re-registration."""

import json

import pytest
import torch
from grpo_testing import make_problem, run_loss, with_triton_interpreted

import grpo_kernels
from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, grpo_objective
from grpo_kernels.losses import LossParam, TermInputs, unregister_loss_type, validate_loss_params

BACKENDS = with_triton_interpreted(["reference", "torch", "gemm", "triton"])


def per_sequence_term(x: TermInputs) -> torch.Tensor:
    return -(x.ratio * x.advantages).sum(-1)  # [B]: one value per sequence, not unsqueezed


def float64_term(x: TermInputs) -> torch.Tensor:
    return -(x.ratio * x.advantages).double()


def divides_by_the_mask(x: TermInputs) -> torch.Tensor:
    """-r A plus lp / m: 0 / 0 = NaN at every padded position, in the value and in d/dlp; exactly -r A + lp
    (a scored token's m is 1) elsewhere."""
    return -x.ratio * x.advantages + x.logps / x.mask


def scaled_surrogate(x: TermInputs) -> torch.Tensor:
    params = x.config.loss_params
    sign = -1.0 if params["maximise"] else 1.0
    return sign * params["scale"] * x.ratio * x.advantages


@pytest.fixture()
def registered():
    names = []

    def register(name, term, **kwargs):
        grpo_kernels.register_loss_type(name, term, "sequence_mean", **kwargs)
        names.append(name)

    yield register
    for name in names:
        unregister_loss_type(name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_term_of_one_value_per_sequence_is_refused_even_when_b_equals_t(registered, backend):
    registered("per_sequence", per_sequence_term)
    problem = make_problem(0, B=4, T=4)
    with pytest.raises(ValueError, match=r"loss type 'per_sequence': its term returned shape \[4\], expected "
                                         r"\[B, T\] = \[4, 4\] .* or \[B, 1\] = \[4, 1\]"):
        run_loss(fused_linear_grpo_loss, problem, GRPOLossConfig(loss_type="per_sequence"), backend=backend)


def test_a_term_of_another_dtype_is_refused(registered):
    registered("float64_term", float64_term)
    lp = torch.randn(2, 3)
    with pytest.raises(TypeError, match=r"loss type 'float64_term': its term returned torch.float64, expected "
                                        r"torch.float32"):
        grpo_objective(lp, torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2), GRPOLossConfig(loss_type="float64_term"))


def test_an_aggregation_of_the_wrong_shape_is_refused():
    grpo_kernels.register_loss_type("row_weights", lambda x: -x.ratio * x.advantages,
                                    lambda m, config, n: m.sum(-1))
    try:
        with pytest.raises(ValueError, match=r"loss type 'row_weights': its aggregation .* returned torch.float32 "
                                             r"\[2\], expected floating weights of the mask's shape \[2, 3\]"):
            grpo_objective(torch.randn(2, 3), torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2),
                           GRPOLossConfig(loss_type="row_weights"))
    finally:
        unregister_loss_type("row_weights")


def poisoned(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x with NaN, +inf and -inf written over its padded positions (in turn)."""
    values = torch.tensor([float("nan"), float("inf"), float("-inf")])
    fill = values[torch.arange(mask.numel()) % 3].view(mask.shape).to(x.dtype)
    return torch.where(mask.bool(), x, fill)


@pytest.mark.parametrize("loss_type", ["divides_by_the_mask", "dapo", "grpo", "cispo", "vespo"])
def test_nothing_computed_at_a_padded_position_reaches_the_loss_or_a_gradient(registered, loss_type):
    if loss_type == "divides_by_the_mask":
        registered(loss_type, divides_by_the_mask)
    gen = torch.Generator().manual_seed(1)
    B, T = 3, 6
    mask = (torch.rand(B, T, generator=gen) > 0.4).float()
    mask[:, 0] = 1
    lp = -torch.rand(B, T, generator=gen) * 3
    entropy = torch.rand(B, T, generator=gen)
    old = lp + 0.1 * torch.randn(B, T, generator=gen)
    ref = lp + 0.2 * torch.randn(B, T, generator=gen)
    rho = 0.5 + torch.rand(B, T, generator=gen)
    advantages = torch.randn(B, T, generator=gen)
    config = GRPOLossConfig(loss_type=loss_type, beta=0.04, entropy_coef=0.01)

    def loss_and_grads(lp, entropy, old, ref, rho, advantages):
        lp, entropy = lp.clone().requires_grad_(), entropy.clone().requires_grad_()
        loss, metrics = grpo_objective(lp, entropy, mask, advantages, config, old_logps=old, ref_logps=ref,
                                       importance_ratio=rho)
        loss.backward()
        return loss, metrics, lp.grad, entropy.grad

    clean = loss_and_grads(lp, entropy, old, ref, rho, advantages)
    dirty = loss_and_grads(*(poisoned(x, mask) for x in (lp, entropy, old, ref, rho, advantages)))
    assert torch.isfinite(clean[0]) and torch.equal(clean[0], dirty[0])
    for name in clean[1]:
        assert torch.equal(clean[1][name], dirty[1][name]), name
    for clean_grad, dirty_grad in zip(clean[2:], dirty[2:]):
        assert torch.isfinite(dirty_grad).all()
        assert torch.equal(clean_grad, dirty_grad)
        assert (dirty_grad[mask == 0] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_term_undefined_at_padding_trains_on_every_backend(registered, backend):
    registered("divides_by_the_mask", divides_by_the_mask)
    problem = make_problem(2, B=3, T=5)
    assert (problem.completion_mask == 0).any()
    out, grads = run_loss(fused_linear_grpo_loss, problem, GRPOLossConfig(loss_type="divides_by_the_mask"),
                          backend=backend)
    assert torch.isfinite(out.loss)
    assert all(torch.isfinite(g).all() for g in grads.values())


def test_declared_hyper_parameters_are_typed_defaulted_checked_and_carried(registered):
    registered("scaled", scaled_surrogate,
               params={"scale": LossParam(1.0, float, minimum=0.0, help="multiplies the term"), "maximise": True})
    config = GRPOLossConfig(loss_type="scaled")
    assert config.loss_params == {"scale": 1.0, "maximise": True}  # the defaults, filled in: saved and logged whole
    assert GRPOLossConfig(loss_type="scaled", loss_params={"scale": 2}).loss_params == {"scale": 2.0, "maximise": True}
    for params, message in [
        ({"scale": -1.0}, r"loss_params.scale: loss_type 'scaled' expected a finite number >= 0, got -1.0"),
        ({"scale": float("nan")}, r"loss_params.scale: loss_type 'scaled' expected a finite number >= 0, got nan"),
        ({"scale": "2"}, r"loss_params.scale: loss_type 'scaled' expected a finite number >= 0, got '2'"),
        ({"maximise": 1}, r"loss_params.maximise: loss_type 'scaled' expected true/false, got 1"),
        ({"scael": 2.0}, r"loss_params.scael: loss_type 'scaled' has no hyper-parameter 'scael'; it declares "
                         r"\['scale', 'maximise'\]"),
        ([("scale", 1.0)], r"loss_params: expected a mapping"),
    ]:
        with pytest.raises(ValueError, match=message):
            GRPOLossConfig(loss_type="scaled", loss_params=params)
    with pytest.raises(ValueError, match=r"loss.params.scale: loss_type 'scaled'"):
        validate_loss_params("scaled", {"scale": -2.0}, key="loss.params")
    with pytest.raises(ValueError, match=r"loss_params.scale: loss_type 'dapo' has no hyper-parameter 'scale'; it "
                                         r"declares none"):
        GRPOLossConfig(loss_params={"scale": 1.0})
    # the value reaches the term (on the custom-op route too, where the config travels as JSON)
    problem = make_problem(3)
    one, _ = run_loss(fused_linear_grpo_loss, problem, GRPOLossConfig(loss_type="scaled"), backend="gemm")
    three, _ = run_loss(fused_linear_grpo_loss, problem,
                        GRPOLossConfig(loss_type="scaled", loss_params={"scale": 3.0}), backend="gemm")
    torch.testing.assert_close(three.loss, 3 * one.loss)
    assert hash(GRPOLossConfig(loss_type="scaled")) == hash(GRPOLossConfig(loss_type="scaled"))
    assert json.loads(json.dumps(config.__dict__))["loss_params"] == {"scale": 1.0, "maximise": True}


@pytest.mark.parametrize("params, error, message", [
    ({"scale": LossParam(-1.0, minimum=0.0)}, ValueError, r"params\['scale'\]: the default does not fit"),
    ({"scale": [1.0]}, TypeError, r"params\['scale'\]: a hyper-parameter is one of"),
    ({"not valid": 1.0}, ValueError, r"params: a hyper-parameter name must be an identifier"),
    ({"mode": LossParam("sum", choices=("mean", "max"))}, ValueError, r"params\['mode'\]: the default does not fit"),
])
def test_a_bad_hyper_parameter_declaration_is_refused_at_registration(params, error, message):
    with pytest.raises(error, match=message):
        grpo_kernels.register_loss_type("bad_params", scaled_surrogate, "sequence_mean", params=params)
    with pytest.raises(ValueError, match="registered loss types"):
        GRPOLossConfig(loss_type="bad_params")


def test_registering_a_name_twice_is_an_error_unless_replace(registered):
    registered("twice", scaled_surrogate, params={"scale": 1.0, "maximise": False})
    with pytest.raises(ValueError, match=r"loss type 'twice' is already registered; pass replace=True"):
        grpo_kernels.register_loss_type("twice", per_sequence_term, "sequence_mean")
    assert GRPOLossConfig(loss_type="twice").loss_params == {"scale": 1.0, "maximise": False}  # unchanged
    grpo_kernels.register_loss_type("twice", float64_term, "sequence_mean", replace=True)
    assert GRPOLossConfig(loss_type="twice").loss_params == {}


# ---- what the objective relies on: inputs left alone, a gradient to lp, finite values where scored ----------

def _clamps_the_ratio_in_place(x: TermInputs) -> torch.Tensor:
    return -x.ratio.clamp_(0.8, 1.2) * x.advantages  # the ratio also feeds the KL correction and the clip metrics


def _detached(x: TermInputs) -> torch.Tensor:
    return (-x.ratio * x.advantages).detach()


def _advantages_alone(x: TermInputs) -> torch.Tensor:
    return -x.advantages * 1.0  # never reads lp: a constant loss


def _nan_at_one_scored_token(x: TermInputs) -> torch.Tensor:
    poison = torch.zeros_like(x.logps)
    poison[1, 2] = float("nan")
    return -x.ratio * x.advantages + poison


def _raises(x: TermInputs) -> torch.Tensor:
    raise ZeroDivisionError("the user's own bug")


BROKEN_TERMS = {
    "clamps_in_place": (_clamps_the_ratio_in_place, RuntimeError, r"its term changed x.ratio in place"),
    "detached": (_detached, RuntimeError, r"its term carries no gradient to x.logps"),
    "advantages_alone": (_advantages_alone, RuntimeError, r"its term carries no gradient to x.logps"),
    "nan_scored": (_nan_at_one_scored_token, ValueError, r"its term is NaN or infinite at 1 scored position\(s\), "
                                                         r"the first at \[1, 2\]"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(BROKEN_TERMS))
def test_a_term_that_breaks_what_the_objective_relies_on_is_named(registered, backend, case):
    term, error, message = BROKEN_TERMS[case]
    registered(case, term)
    problem = make_problem(3, B=2, T=4)
    with pytest.raises(error, match=rf"^loss type '{case}': {message}"):
        run_loss(fused_linear_grpo_loss, problem, GRPOLossConfig(loss_type=case), backend=backend)


def test_an_error_raised_inside_a_term_names_the_loss_type(registered):
    registered("raises", _raises)
    with pytest.raises(ZeroDivisionError, match="the user's own bug") as raised:
        grpo_objective(torch.randn(2, 3, requires_grad=True), torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2),
                       GRPOLossConfig(loss_type="raises"))
    assert "in the term of loss type 'raises' (register_loss_type)" in raised.value.__notes__


def test_a_term_without_a_gradient_is_fine_where_none_is_asked(registered):
    registered("detached_ok", _detached)
    with torch.no_grad():  # old / reference log-probs, metrics: nothing to train
        loss, _ = grpo_objective(torch.randn(2, 3), torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2),
                                 GRPOLossConfig(loss_type="detached_ok"))
    assert torch.isfinite(loss)


# ---- a registered aggregation, and a term's device, held as a term is ---------------------------------------------

def _term_on_meta(x: TermInputs) -> torch.Tensor:
    return (-x.ratio * x.advantages).to("meta")


def _nan_weights(mask, config, num_items):
    return mask * float("nan")


def _weights_on_meta(mask, config, num_items):
    return (mask / mask.sum()).to("meta")


def _weights_raising(mask, config, num_items):
    raise ZeroDivisionError("the user's own bug")


BROKEN_AGGREGATIONS = {  # (term, aggregation) -> the error and its words
    "term_on_meta": (_term_on_meta, "sequence_mean", ValueError,
                     r"^loss type 'term_on_meta': its term returned a tensor on meta, expected cpu"),
    "nan_weights": (lambda x: -x.ratio * x.advantages, _nan_weights, ValueError,
                    r"^loss type 'nan_weights': its aggregation 'nan_weights_aggregation' returned NaN or infinite "
                    r"weights where the mask is 1$"),
    "weights_on_meta": (lambda x: -x.ratio * x.advantages, _weights_on_meta, ValueError,
                        r"^loss type 'weights_on_meta': its aggregation .* returned torch.float32 \[2, 4\] on meta, "
                        r"expected floating weights of the mask's shape \[2, 4\] on cpu$"),
    "weights_raising": (lambda x: -x.ratio * x.advantages, _weights_raising, ZeroDivisionError,
                        r"^the user's own bug"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(BROKEN_AGGREGATIONS))
def test_a_broken_aggregation_or_a_term_elsewhere_is_named(backend, case):
    term, aggregation, error, message = BROKEN_AGGREGATIONS[case]
    grpo_kernels.register_loss_type(case, term, aggregation)
    try:
        with pytest.raises(error, match=message) as raised:
            run_loss(fused_linear_grpo_loss, make_problem(3, B=2, T=4), GRPOLossConfig(loss_type=case),
                     backend=backend)
        if error is ZeroDivisionError:
            assert f"in the aggregation of loss type {case!r} (register_loss_type)" in raised.value.__notes__
    finally:
        unregister_loss_type(case)
