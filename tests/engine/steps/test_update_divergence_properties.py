"""An optimizer step that diverges stops the run in one line naming the step and the learning rate, before the
weights are sampled from or saved (hypothesis draws the learning rate, the clipping and the weight decay). Before,
`optim.learning_rate` 1e30 wrote weights of 1e30 and the next step failed in the sampler ("probability tensor
contains either inf, nan or element < 0", or "hidden contains NaN or Inf values"), after a checkpoint of those
weights had been saved; and lr 1 to 1e5, below that limit, wrecked the weights while keeping them finite, and the
run trained on noise without a word."""

from __future__ import annotations

import math
from typing import Optional

import pytest
import torch
from accelerate import Accelerator
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from grpo_engine import trainer as trainer_module
from grpo_engine.config import ModelConfig, load_config
from grpo_engine.model.loading import HiddenStatePolicy, load_causal_lm
from grpo_engine.state.checkpoint import list_checkpoints, nonfinite_weights, resolve_resume
from grpo_engine.steps.update import WEIGHT_LIMIT, DivergedUpdateError, UpdateInputs, policy_update
from grpo_engine.steps.update_checks import MAX_STEP_GROWTH
from grpo_kernels import GRPOLossConfig
from rollout_batches import synthetic_batch

CPU = torch.device("cpu")


def one_adamw_step(model_dir, lr: float, max_grad_norm: float, weight_decay: float, gradient_scale: float = 1.0):
    lm = load_causal_lm(str(model_dir), ModelConfig(), CPU)
    policy = HiddenStatePolicy(lm).train()
    if gradient_scale != 1.0:  # one weight's gradient overflows while the loss stays finite
        next(policy.parameters()).register_hook(lambda grad: grad * gradient_scale)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    batch = synthetic_batch(lm.config.vocab_size)
    inputs = UpdateInputs(batch, torch.linspace(-1.5, 1.5, 8), None, None, float(batch.completion_mask.sum()))
    policy_update(Accelerator(cpu=True), policy, lm, optimizer, scheduler, inputs, GRPOLossConfig(), 8,
                  num_iterations=1, max_grad_norm=max_grad_norm, backend="torch", step=7)
    return policy


def weights_norm(parameters) -> float:
    return math.sqrt(sum(float(p.detach().double().square().sum()) for p in parameters))


def measure_adamw_steps(monkeypatch) -> list[float]:
    """The trained weights' norm before and after each AdamW step from now on, in the list returned."""
    norms: list[float] = []
    real_step = torch.optim.AdamW.step

    def measured(self, *args, **kwargs):
        norms.append(weights_norm(p for group in self.param_groups for p in group["params"]))
        out = real_step(self, *args, **kwargs)
        norms.append(weights_norm(p for group in self.param_groups for p in group["params"]))
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", measured)
    return norms


def judged_step(monkeypatch, lr: float, take_step) -> tuple[Optional[str], float, float]:
    """(the DivergedUpdateError's line or None, the weights' norm before and after) of one AdamW step taken by
    `take_step`, asserting it stopped exactly when the step grew the norm past MAX_STEP_GROWTH-fold."""
    norms = measure_adamw_steps(monkeypatch)
    try:
        take_step()
        stopped = None
    except DivergedUpdateError as exc:
        stopped = str(exc)
    before, after = norms
    assert (stopped is not None) == (after > MAX_STEP_GROWTH * before), (lr, after / before, stopped)
    return stopped, before, after


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(exponent=st.integers(-4, 36), max_grad_norm=st.sampled_from([0.0, 1.0]),
       weight_decay=st.sampled_from([0.0, 0.01]))
@example(exponent=3, max_grad_norm=1.0, weight_decay=0.0)  # finite, wrecked: trained on silently before
def test_a_step_that_diverges_stops_in_one_line_and_one_that_does_not_goes_on(exponent, max_grad_norm, weight_decay,
                                                                              tiny_model_dir):
    """AdamW moves each weight by about lr; the demo model's weights are about 0.06 in size, so lr 0.1 grows their
    norm about 2-fold (trains) and lr 1 17-fold (wrecks: stopped, like lr 1e30's NaN, whatever the clipping)."""
    lr = 10.0 ** exponent
    try:
        policy = one_adamw_step(tiny_model_dir, lr, max_grad_norm, weight_decay)
    except DivergedUpdateError as exc:
        message = str(exc)
        assert "\n" not in message and "step 7" in message and "optim.learning_rate" in message, message
        assert lr >= 1, f"lr {lr:g} stopped: {message}"
        return
    assert lr < 1, f"lr {lr:g} (AdamW steps of about lr) went on"
    assert all(bool(p.isfinite().all()) and p.abs().max() <= WEIGHT_LIMIT for p in policy.parameters())


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lr=st.floats(1e-3, 1e3))
@example(lr=1e-2)
@example(lr=1e3)
def test_a_step_stops_exactly_when_it_grows_the_weights_past_the_bound(lr, tiny_model_dir, monkeypatch):
    """Below WEIGHT_LIMIT the weights stay finite: the step is judged by what it did to them (their norm grown more
    than MAX_STEP_GROWTH-fold), measured here around the real step. Before, lr 1e3 trained on silently: the policy's
    output turned uniform and its gradient 0 for every later step."""
    stopped, before, after = judged_step(monkeypatch, lr, lambda: one_adamw_step(tiny_model_dir, lr, 1.0, 0.0))
    if stopped:
        assert "\n" not in stopped and f"norm {after / before:.3g}-fold" in stopped and \
            "Lower optim.learning_rate" in stopped, stopped


@pytest.mark.parametrize("max_grad_norm", [0.0, 1.0])
def test_a_gradient_that_overflowed_is_named_as_the_cause_not_the_learning_rate(max_grad_norm, tiny_model_dir):
    """An inf gradient makes the step NaN (clipped: inf x 0) whatever the learning rate: before, the line advised
    lowering it."""
    with pytest.raises(DivergedUpdateError) as raised:
        one_adamw_step(tiny_model_dir, 1e-3, max_grad_norm, 0.0, gradient_scale=math.inf)
    message = str(raised.value)
    assert "the gradient norm was inf" in message and "The gradient itself was inf (the loss was finite)" in message
    assert "Lower optim.learning_rate" not in message and "model.dtype" in message, message


def test_nan_weights_after_the_step_stop_it(tiny_model_dir, monkeypatch):
    """An optimizer that writes NaN (an overflow in its state, say) with a finite gradient norm: stopped too."""
    real = torch.optim.AdamW.step

    def poisoned(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        with torch.no_grad():
            self.param_groups[0]["params"][-1].view(-1)[0] = math.nan
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", poisoned)
    with pytest.raises(DivergedUpdateError, match="step 7 diverged: a trained weight is now NaN or inf"):
        one_adamw_step(tiny_model_dir, 1e-3, 1.0, 0.0)


def test_a_run_that_diverges_keeps_its_last_good_checkpoint_to_resume_from(small_overrides, monkeypatch):
    """Step 2 of a run saving every step diverges: the run stops there, checkpoint-1 (finite) stays the last one."""
    real = trainer_module.policy_update

    def diverging_at_step_2(*args, **kwargs):
        optimizer, step = args[3], args[11]  # as trainer.update passes them
        if step == 2:
            for group in optimizer.param_groups:
                group["lr"] = 1e30
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "policy_update", diverging_at_step_2)
    config = load_config(overrides={**small_overrides, "run.max_steps": 2, "run.save_steps": 1})
    with pytest.raises(DivergedUpdateError, match="at step 2 diverged"):
        trainer_module.train(config)
    saved = list_checkpoints(config.run.output_dir)
    assert [path.name for path in saved] == ["checkpoint-000001"] and not nonfinite_weights(saved[0])
    assert resolve_resume("latest", config.run.output_dir).path == saved[0]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(exponent=st.floats(-4, 36))
@example(exponent=0.0)  # lr 1: the weights' norm 17-fold, finite; trained on from wrecked weights before
@example(exponent=30.0)  # the warm start's weight decay flips the weights' signs: refused as the schema's rule
def test_the_warm_starts_steps_are_checked_as_the_updates_are(exponent, monkeypatch):
    """The demo's supervised warm start is an AdamW loop of its own, before step 1. Its learning rate went unchecked:
    run.warm_start_learning_rate 1e30 (or 1, wrecked but finite) ended at step 1 as "the model's forward gave NaN or
    inf hidden states ... although its weights are finite", naming no setting. Now the schema bounds it by the warm
    start's weight decay, as optim.weight_decay bounds optim.learning_rate, and each warm-start step is judged as an
    update's is: stopped exactly when it grows the weights' norm past MAX_STEP_GROWTH-fold, naming the setting."""
    from grpo_engine.config import ConfigError
    from grpo_engine.config.schema import WARM_START_WEIGHT_DECAY
    from grpo_engine.data.demo_task import build_char_tokenizer, build_tiny_model
    from grpo_engine.data.warm_start import supervised_warm_start

    lr = 10.0 ** exponent
    if lr * WARM_START_WEIGHT_DECAY > 1:
        with pytest.raises(ConfigError, match=r"^run.warm_start_learning_rate x the warm start's AdamW weight decay"):
            load_config(overrides={"run.warm_start_learning_rate": lr})
        return
    load_config(overrides={"run.warm_start_learning_rate": lr})
    tokenizer = build_char_tokenizer()
    stopped, _, _ = judged_step(monkeypatch, lr, lambda: supervised_warm_start(
        build_tiny_model(tokenizer, 0), tokenizer, ["1+1=", "2+3="], ["\\boxed{2}", "\\boxed{5}"], 1, lr, 2, 0, CPU,
        backend="torch"))
    if stopped:
        assert "\n" not in stopped and "warm-start step 1" in stopped and \
            "Lower run.warm_start_learning_rate" in stopped and "optim.learning_rate" not in stopped, stopped
