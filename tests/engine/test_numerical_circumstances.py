"""Runs whose numbers go wrong without an exception, through `train` / `grpo-engine eval`: each is said in one line
(a warning, or an error before step 1) instead of a run that trains on nothing or a metric that reads as a value.
The mechanisms have their property tests (tests/engine/model/test_update_precision_properties.py,
tests/engine/model/test_finite_forward_properties.py, tests/engine/steps/test_update_divergence_properties.py);
these check that a run meets them."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from grpo_engine.config import ConfigError, load_config
from grpo_engine.trainer import train
from repo_paths import SUPPORT


@pytest.mark.slow  # train() end to end: the slow tier
def test_a_step_whose_every_completion_is_masked_out_is_said(small_overrides, capsys):
    """rollout.max_new_tokens 2 truncates every answer of the addition task, and mask_truncated_completions masks
    each out: no token is in the loss. Before, nothing was said (the rewards were equal too)."""
    train(load_config(overrides={**small_overrides, "run.max_steps": 1, "rollout.max_new_tokens": 2,
                                 "rollout.mask_truncated_completions": True, "rewards.length_cache": 1}))
    warnings = [line for line in capsys.readouterr().err.splitlines() if "no completion token is in the loss" in line]
    assert len(warnings) == 1 and "at step 1" in warnings[0], warnings


@pytest.mark.slow  # train() end to end: the slow tier
@pytest.mark.parametrize("dtype, lr, master_weights, warned", [
    ("bfloat16", 1e-6, "none", True), ("bfloat16", 1e-6, "auto", False), ("bfloat16", 1e-2, "none", False),
    ("float32", 1e-6, "auto", False)])
def test_a_learning_rate_the_weights_dtype_cannot_hold_is_said_when_the_run_starts(dtype, lr, master_weights, warned,
                                                                                   small_overrides, tiny_model_dir,
                                                                                   caplog):
    """bfloat16 (model.dtype auto on CUDA) at the default learning rate, stepped in bfloat16 (optim.master_weights
    none): 98% of the demo model's weights never change, said at the start. Stepped through float32 copies (auto,
    the default) every step counts: nothing to say."""
    with caplog.at_level(logging.WARNING, logger="grpo_engine"):
        train(load_config(overrides={**small_overrides, "run.max_steps": 1, "model.name_or_path": str(tiny_model_dir),
                                     "model.dtype": dtype, "optim.learning_rate": lr,
                                     "optim.master_weights": master_weights}))
    said = [r.getMessage() for r in caplog.records if "rounds back to the same weight" in r.getMessage()]
    assert len(said) == warned, said
    if warned:
        assert "of the trained weights that are not 0 (bfloat16, model.dtype bfloat16)" in said[0]


@pytest.mark.slow  # train() end to end: the slow tier
@pytest.mark.parametrize("lora, master_weights", [(False, "none"), (False, "auto"), (True, "auto")])
def test_float16_full_training_is_refused_before_step_1_unless_float32_steps_it(lora, master_weights,
                                                                               small_overrides, tiny_model_dir):
    """AdamW's moments in float16 cannot hold its epsilon 1e-8: NaN weights at step 1 whatever the learning rate,
    with the advice to lower it. Refused with optim.master_weights none; float32 copies (auto) and LoRA's adapters
    (peft keeps them in float32) train."""
    config = load_config(overrides={**small_overrides, "run.max_steps": 1, "model.name_or_path": str(tiny_model_dir),
                                    "model.dtype": "float16", "model.lora.enabled": lora,
                                    "optim.master_weights": master_weights})
    if master_weights == "auto":
        assert train(config).steps == 1
        return
    with pytest.raises(ConfigError, match=r"^optim.adam_epsilon 1e-08 rounds to 0 in float16"):
        train(config)
    assert not (Path(config.run.output_dir) / "metrics.jsonl").exists()  # no step began


def test_eval_gives_null_for_a_reward_that_scored_nothing(tiny_model_dir, monkeypatch, capsys):
    """As training logs it: before, `rewards/<fn>/mean` read 0.0, a score the function never gave."""
    from grpo_engine.cli import main

    monkeypatch.syspath_prepend(str(SUPPORT))
    assert main(["eval", "--model", str(tiny_model_dir), "--data.builtin_max_operand", "1",
                 "--rewards.functions", "[user_rewards:always_nan, user_rewards:digit_count]"]) == 0
    metrics = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    assert metrics["rewards/always_nan/mean"] is None and isinstance(metrics["rewards/digit_count/mean"], float)
