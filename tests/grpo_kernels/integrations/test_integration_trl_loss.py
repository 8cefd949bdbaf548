"""TRL's own GRPOTrainer._compute_loss vs the patched one, on one fixed batch and one tiny Qwen2 model (and
tiny Gemma 2, Cohere and Granite models, whose logits are soft-capped or scaled).

Two real GRPOTrainer instances share the model: one is TRL as installed, one goes through
`patch_grpo_trainer`. Each case sets the same loss options on both, runs `_compute_loss` + backward on each,
and compares (float32):
- loss: |patched - TRL| <= 1e-5 * max(1, |TRL|)
- every parameter gradient: max |patched - TRL| <= 1e-4 * max |TRL grad| + 1e-7
- logged metrics: the same names, values within 2e-5 absolute.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from grpo_testing import config_warning_expected
from integration_models import TRANSFORMED_FAMILIES, VOCAB_SIZE, tiny_causal_lm, tiny_grpo_trainer

trl = pytest.importorskip("trl")
from grpo_kernels.integrations.trl import patch_grpo_trainer  # noqa: E402
from grpo_kernels.integrations.trl_loss import fused_path_blocker  # noqa: E402

LOSS_RTOL, GRAD_RTOL, METRIC_ATOL = 1e-5, 1e-4, 2e-5
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
GRADIENT_ACCUMULATION = 2

# Options each case may set, and their TRL defaults; the trainer attribute (or args field) each one lives on.
TRAINER_DEFAULTS = dict(loss_type="dapo", beta=0.0, importance_sampling_level="token", epsilon_high=0.2,
                        top_entropy_quantile=1.0, entropy_coef=0.0, _entropy_bonus_enabled=False,
                        off_policy_mask_threshold=None, use_vllm=False, vllm_importance_sampling_correction=False)
ARGS_DEFAULTS = dict(delta=None, use_bias_correction_kl=False)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return _setup(tmp_path_factory, "qwen2")


@pytest.fixture(scope="module", params=TRANSFORMED_FAMILIES)
def transformed_setup(tmp_path_factory, request):
    return _setup(tmp_path_factory, request.param)


def _setup(tmp_path_factory, family: str):
    model = tiny_causal_lm(family, seed=3)
    reference = tiny_grpo_trainer(trl.GRPOTrainer, model, tmp_path_factory.mktemp("trl"))
    patched = patch_grpo_trainer(tiny_grpo_trainer(trl.GRPOTrainer, model, tmp_path_factory.mktemp("kernels")),
                                 backend="torch")
    model.train()
    for trainer in (reference, patched):
        trainer.current_gradient_accumulation_steps = GRADIENT_ACCUMULATION
        trainer.args.steps_per_generation = 2
    return model, reference, patched, _fixed_batch(reference, model)


def _fixed_batch(trainer, model) -> dict:
    generator = torch.Generator().manual_seed(7)
    B, P, C = 4, 5, 7
    prompt_ids = torch.randint(3, VOCAB_SIZE, (B, P), generator=generator)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    prompt_mask[1, :2] = 0  # left padding
    completion_ids = torch.randint(3, VOCAB_SIZE, (B, C), generator=generator)
    completion_mask = (torch.arange(C)[None, :] < torch.tensor([7, 5, 3, 6])[:, None]).long()  # right padding
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            model, torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1), C)
    noise = lambda scale: scale * torch.randn(B, C, generator=generator) * completion_mask  # noqa: E731
    # Old log-probs off by up to ~exp(+-0.5): some ratios fall outside [0.8, 1.2] and get clipped.
    old = logps + noise(0.25) + 0.2 * torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * completion_mask
    return {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
        "completion_ids": completion_ids, "completion_mask": completion_mask,
        "advantages": torch.tensor([1.2, -0.7, 0.4, -1.1]),
        "old_per_token_logps": old,
        "ref_per_token_logps": logps + noise(0.3),
        # As if the generation batch held twice this micro-batch's tokens.
        "num_items_in_batch": completion_mask.sum() * 2,
        "importance_sampling_ratio": torch.exp(noise(0.2)),
    }


def _configure(trainer, options: dict) -> None:
    for name, default in TRAINER_DEFAULTS.items():
        setattr(trainer, name, options.get(name, default))
    for name, default in ARGS_DEFAULTS.items():
        setattr(trainer.args, name, options.get(name, default))
    trainer._entropy_bonus_enabled = trainer.entropy_coef != 0.0


def _run(trainer, model, inputs) -> tuple[float, dict, dict]:
    model.zero_grad(set_to_none=True)
    trainer._metrics["train"].clear()
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads, {name: list(values) for name, values in trainer._metrics["train"].items()}


def _compare(setup, options: dict, inputs: dict | None = None, expect_fused: bool = True) -> dict:
    model, reference, patched, batch = setup
    inputs = batch if inputs is None else inputs
    for trainer in (reference, patched):
        _configure(trainer, options)
    assert (fused_path_blocker(patched, inputs) is None) == expect_fused, fused_path_blocker(patched, inputs)
    expected_loss, expected_grads, expected_metrics = _run(reference, model, inputs)
    config_options = {key: options[key] for key in ("loss_type", "importance_sampling_level") if key in options}
    with config_warning_expected(**config_options):  # the patched trainer builds the config, and warns as TRL
        loss, grads, metrics = _run(patched, model, inputs)

    assert math.isfinite(expected_loss) and expected_loss != 0.0
    assert abs(loss - expected_loss) <= LOSS_RTOL * max(1.0, abs(expected_loss)), (loss, expected_loss)
    assert grads.keys() == expected_grads.keys() and len(grads) > 0
    for name, expected in expected_grads.items():
        scale = expected.abs().max().item()
        error = (grads[name] - expected).abs().max().item()
        assert error <= GRAD_RTOL * scale + 1e-7, f"{name}: max error {error:.3g}, max |grad| {scale:.3g}"
    assert metrics.keys() == expected_metrics.keys()
    for name, values in expected_metrics.items():
        torch.testing.assert_close(torch.tensor(metrics[name]), torch.tensor(values), atol=METRIC_ATOL, rtol=0,
                                   equal_nan=True, msg=lambda m: f"metric {name}: {m}")
    return expected_metrics


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_grads_and_metrics_match_trl(setup, loss_type, level, beta):
    options = dict(loss_type=loss_type, importance_sampling_level=level, beta=beta)
    if loss_type == "cispo":
        options["epsilon_high"] = 1.1  # cispo's cap is absolute: put it where some ratios exceed it
    metrics = _compare(setup, options, expect_fused=True)
    if loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo") and level == "token":
        assert metrics["clip_ratio/region_mean"][0] > 0  # the batch exercises the clipped branch
    if loss_type == "cispo" and level == "token":
        assert metrics["cispo_clip_ratio"][0] > 0


@pytest.mark.parametrize("options", [
    dict(loss_type="grpo", delta=1.1),
    dict(loss_type="dapo", delta=1.1, beta=0.04, use_bias_correction_kl=True),
    dict(loss_type="dapo", top_entropy_quantile=0.5),
    dict(loss_type="grpo", importance_sampling_level="sequence", top_entropy_quantile=0.3),
    dict(loss_type="grpo", entropy_coef=0.05),
    dict(loss_type="bnpo", entropy_coef=0.05, beta=0.04),
    dict(loss_type="dapo", use_vllm=True, vllm_importance_sampling_correction=True),
    dict(loss_type="sapo", use_vllm=True, vllm_importance_sampling_correction=True),
    dict(loss_type="vespo"),  # vespo folds the importance ratio in whenever the batch carries one
], ids=lambda options: "-".join(f"{k}={v}" for k, v in options.items()))
def test_options_on_the_fused_path_match_trl(setup, options):
    _compare(setup, options, expect_fused=True)


@pytest.mark.parametrize("options", [
    dict(loss_type="dapo", off_policy_mask_threshold=0.01),
    dict(loss_type="dapo", entropy_coef=0.05),
    dict(loss_type="grpo", entropy_coef=0.05, top_entropy_quantile=0.5),
], ids=lambda options: "-".join(f"{k}={v}" for k, v in options.items()))
def test_options_kept_on_trl_loss_code_match_trl(setup, options):
    # TRL's loss arithmetic on the kernels' log-probs and entropies.
    _compare(setup, options, expect_fused=False)


# Settings GRPOLossConfig refuses (its bounds) but TRL's `_compute_loss` computes with: TRL's own loss code runs
# on them. Before, the config refused them at the first step, after the first generation, while TRL trained.
OUTSIDE_THE_CONFIG = st.one_of(
    st.builds(lambda value: dict(delta=value), st.floats(0.5, 1.0)),
    st.builds(lambda value: dict(beta=value), st.floats(-0.1, -1e-3)),
    st.builds(lambda value: dict(epsilon_high=value), st.floats(-0.15, -1e-3)),
    st.builds(lambda value: dict(top_entropy_quantile=value), st.just(0.0) | st.floats(1.01, 3.0)),
)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(options=OUTSIDE_THE_CONFIG, loss_type=st.sampled_from(["grpo", "bnpo", "dr_grpo", "dapo"]))
def test_settings_outside_the_fused_config_run_trl_loss_code(setup, options, loss_type):
    _compare(setup, dict(options, loss_type=loss_type), expect_fused=False)


@pytest.mark.parametrize("options", [
    dict(loss_type="grpo"),
    dict(loss_type="dapo", importance_sampling_level="sequence", beta=0.04),
    dict(loss_type="cispo", epsilon_high=1.1),
    dict(loss_type="vespo"),
], ids=lambda options: "-".join(f"{k}={v}" for k, v in options.items()))
def test_advantages_of_one_column_match_trl(setup, options):
    # TRL unsqueezes only a 1-d `advantages`; a subclass's [B, 1] broadcasts as one value per sequence
    batch = dict(setup[3])
    batch["advantages"] = batch["advantages"][:, None]
    _compare(setup, options, inputs=batch)


@pytest.mark.parametrize("options", [
    dict(loss_type="dapo", beta=0.04),
    dict(loss_type="grpo", importance_sampling_level="sequence", entropy_coef=0.05),
    dict(loss_type="bnpo", entropy_coef=0.05, top_entropy_quantile=0.5),  # TRL's loss code, the kernels' logps
], ids=lambda options: "-".join(f"{k}={v}" for k, v in options.items()))
def test_transformed_heads_match_trl(transformed_setup, options):
    """TRL's fused head applies the model's soft-cap / scale from its config; so must the kernels, on the fused
    loss (one-pass and two-step routes) and on the log-probs TRL's own loss code gets."""
    _compare(transformed_setup, options, expect_fused=options.get("top_entropy_quantile", 1.0) == 1.0)


def test_tool_mask_is_part_of_the_loss_mask(setup):
    batch = dict(setup[3])
    tool_mask = torch.ones_like(batch["completion_mask"])
    tool_mask[0, 2:4] = 0  # tokens a tool wrote: not the policy's
    batch["tool_mask"] = tool_mask
    _compare(setup, dict(loss_type="dapo", beta=0.04), inputs=batch)


def test_eval_mode_uses_trl_eval_scaling(setup):
    model = setup[0]
    model.eval()
    try:
        _compare(setup, dict(loss_type="dapo"))
        _compare(setup, dict(loss_type="grpo", beta=0.04))
    finally:
        model.train()
