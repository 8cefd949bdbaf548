"""The update step: gradient accumulation does not change the gradient of a batch, and a NaN loss stops."""

import pytest
import torch
from accelerate import Accelerator

from grpo_engine.config import ModelConfig
from grpo_engine.model.loading import HiddenStatePolicy, load_causal_lm
from grpo_engine.steps import update as update_module
from grpo_engine.steps.update import NonFiniteLossError, UpdateInputs, policy_update
from grpo_kernels import GRPOLossConfig
from grpo_testing import loss_config
from rollout_batches import synthetic_batch

CPU = torch.device("cpu")


def one_sgd_step(model_dir, loss_config, micro_batch_size, backend="torch"):
    accelerator = Accelerator(cpu=True)
    lm = load_causal_lm(str(model_dir), ModelConfig(), CPU)
    policy = HiddenStatePolicy(lm).train()
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)  # parameter change = -gradient
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    batch = synthetic_batch(lm.config.vocab_size)
    advantages = torch.linspace(-1.5, 1.5, 8)
    mask = batch.completion_mask
    inputs = UpdateInputs(batch, advantages, None, None, float(mask.sum()))
    metrics = policy_update(accelerator, policy, lm, optimizer, scheduler, inputs, loss_config, micro_batch_size,
                            num_iterations=1, max_grad_norm=0.0, backend=backend, step=1)
    grads = {n: before[n] - p.detach() for n, p in policy.named_parameters()}
    return grads, metrics


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo", "luspo", "bnpo", "sapo"])
def test_accumulation_does_not_change_the_gradient(tiny_model_dir, loss_type):
    config = loss_config(loss_type=loss_type, max_completion_length=7)
    whole, whole_metrics = one_sgd_step(tiny_model_dir, config, micro_batch_size=8)
    split, split_metrics = one_sgd_step(tiny_model_dir, config, micro_batch_size=4)
    assert any(g.abs().max() > 0 for g in whole.values())
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], atol=1e-6, rtol=1e-4, msg=name)
    assert split_metrics["loss"] == pytest.approx(whole_metrics["loss"], abs=1e-6)
    assert whole_metrics["grad_norm"] > 0


def test_nan_loss_stops_before_the_optimizer_step(tiny_model_dir, monkeypatch):
    real = update_module.fused_linear_grpo_loss

    def nan_loss(*args, **kwargs):
        out = real(*args, **kwargs)
        out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(update_module, "fused_linear_grpo_loss", nan_loss)
    with pytest.raises(NonFiniteLossError, match="the loss is nan at step 1"):
        one_sgd_step(tiny_model_dir, GRPOLossConfig(), micro_batch_size=8)


def test_clip_extremes_are_trls_per_completion_min_and_max():
    from types import SimpleNamespace

    from grpo_engine.steps.update import sequence_clip_extremes

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    logps = torch.zeros(3, 4)
    # ratio = exp(logps - old): row 0 has one token below 1 - epsilon, row 1 one above 1 + epsilon.
    old = torch.tensor([[0.0, 0.5, -0.5, 0.0], [-0.5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    inputs = UpdateInputs(SimpleNamespace(completion_mask=mask), torch.tensor([-1.0, 1.0, 1.0]), old, None, 1.0)
    accelerator, config = Accelerator(cpu=True), GRPOLossConfig(epsilon=0.2)
    both = sequence_clip_extremes(accelerator, logps, inputs, slice(0, 3), config)
    # Row 0: 1 of 3 tokens low-clipped (negative advantage), none high; row 1: 1 of 2 high; row 2 is empty.
    assert both == {"clip_ratio/low_min": 0.0, "clip_ratio/high_max": 0.5}
    first = sequence_clip_extremes(accelerator, logps[:1], inputs, slice(0, 1), config)
    assert first["clip_ratio/low_min"] == pytest.approx(1 / 3) and first["clip_ratio/high_max"] == 0.0
    empty = sequence_clip_extremes(accelerator, logps[2:], inputs, slice(2, 3), config)
    assert all(value != value for value in empty.values())  # NaN: nothing to measure (logged as null)
