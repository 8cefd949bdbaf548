"""Real GRPOTrainer.train() steps on CPU through the kernels: weights move, metrics keep TRL's names.

TRL's own chunked LM head is made to raise during these runs, so every log-prob and loss of the training
step must come from grpo_kernels.
"""

from __future__ import annotations

import pytest
import torch
from integration_models import tiny_causal_lm, tiny_grpo_trainer

trl = pytest.importorskip("trl")
import trl.trainer.utils as trl_utils  # noqa: E402

import grpo_kernels.integrations.trl as kernels_trl  # noqa: E402
from grpo_kernels.integrations.trl import GRPOKernelsTrainer  # noqa: E402

# Two optimizer steps of two accumulated micro-batches each: one generation batch of 4 completions per step.
TRAIN_SETTINGS = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=2, disable_tqdm=True)


def _train_logs(trainer) -> list[dict]:
    trainer.train()
    return [entry for entry in trainer.state.log_history if "loss" in entry]


def count_fused_steps(monkeypatch) -> list:
    """From now on: count fused-loss steps and forbid TRL's own LM-head kernel."""
    calls = []
    original = kernels_trl.fused_compute_loss

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    def forbidden(*args, **kwargs):
        raise AssertionError("TRL's chunked LM head ran: the patch did not take over the log-probs")

    monkeypatch.setattr(kernels_trl, "fused_compute_loss", counting)
    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", forbidden)
    return calls


@pytest.mark.slow
def test_train_steps_update_weights_and_log_trl_metrics(tmp_path, monkeypatch):
    # TRL first, as installed, for the metric names and first-step values to compare with.
    reference = tiny_grpo_trainer(trl.GRPOTrainer, tiny_causal_lm("qwen2", seed=5), tmp_path / "trl",
                                  **TRAIN_SETTINGS)
    reference_logs = _train_logs(reference)
    fused_steps = count_fused_steps(monkeypatch)

    model = tiny_causal_lm("qwen2", seed=5)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = tiny_grpo_trainer(GRPOKernelsTrainer, model, tmp_path / "kernels", **TRAIN_SETTINGS)
    logs = _train_logs(trainer)

    assert len(fused_steps) == 4  # 2 steps x 2 accumulated micro-batches, all on the fused loss
    changed = [name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert "lm_head.weight" in changed and len(changed) == len(before)
    assert [sorted(entry) for entry in logs] == [sorted(entry) for entry in reference_logs]
    for name in ("entropy", "clip_ratio/region_mean", "loss", "reward"):
        assert name in logs[0]
    # Same seed, same initial weights, same generations: the first step's numbers agree with TRL's.
    for name in ("entropy", "reward", "clip_ratio/region_mean", "clip_ratio/low_min", "grad_norm"):
        assert logs[0][name] == pytest.approx(reference_logs[0][name], rel=1e-4, abs=1e-5), name


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gemma2", "granite"])
def test_train_transformed_head_with_cast_lm_head_to_fp32(tmp_path, monkeypatch, family):
    """TRL's own test_train_with_cast_lm_head_to_fp32 scenario: a tiny Gemma 2 (soft-capped logits; and a Granite,
    scaled) trains with GRPOTrainer, and through the kernels to the same first-step numbers."""
    settings = dict(TRAIN_SETTINGS, cast_lm_head_to_fp32=True)
    reference_logs = _train_logs(tiny_grpo_trainer(trl.GRPOTrainer, tiny_causal_lm(family, seed=5),
                                                   tmp_path / "trl", **settings))
    fused_steps = count_fused_steps(monkeypatch)

    model = tiny_causal_lm(family, seed=5)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    logs = _train_logs(tiny_grpo_trainer(GRPOKernelsTrainer, model, tmp_path / "kernels", **settings))

    assert len(fused_steps) == 4
    assert all(not torch.equal(p.detach(), before[name]) for name, p in model.named_parameters())
    for name in ("entropy", "reward", "clip_ratio/region_mean", "grad_norm"):
        assert logs[0][name] == pytest.approx(reference_logs[0][name], rel=1e-4, abs=1e-5), name


@pytest.mark.slow
def test_train_with_lora_adapter_kl_and_entropy_bonus(tmp_path, monkeypatch):
    peft = pytest.importorskip("peft")
    fused_steps = count_fused_steps(monkeypatch)
    model = tiny_causal_lm("llama", seed=6)
    base_before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = tiny_grpo_trainer(
        GRPOKernelsTrainer, model, tmp_path, loss_type="grpo", beta=0.04, entropy_coef=0.01, **TRAIN_SETTINGS,
        peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    logs = _train_logs(trainer)

    assert len(fused_steps) == 4
    # The reference log-probs come from the adapter-disabled model through the kernels; the KL is logged.
    assert {"kl", "entropy", "policy_loss", "entropy_coef", "clip_ratio/high_max"} <= set(logs[-1])
    lora = {name: p for name, p in trainer.model.named_parameters() if "lora_" in name}
    assert lora and any(p.abs().sum() > 0 for name, p in lora.items() if "lora_B" in name)  # B starts at zero
    for name, p in trainer.model.get_base_model().named_parameters():
        if "lora_" not in name:
            assert torch.equal(p.detach(), base_before[name.replace(".base_layer", "")]), name
