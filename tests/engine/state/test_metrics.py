"""The logged metrics: TRL's names (compared with a real TRL GRPOTrainer), valid JSON, run-health warnings."""

import json
import math
from pathlib import Path

import pytest

from grpo_engine.config import load_config
from grpo_engine.state.health import RunHealth, UnscoredRunError
from grpo_engine.state.metrics import completion_metrics
from grpo_engine.trainer import train

from repo_paths import SUPPORT
# What the engine logs beyond TRL: per-phase timings, throughput and peak memory.
ENGINE_EXTRAS = {"time/generate", "time/score", "time/logprobs", "time/update", "time/step", "tokens/s",
                 "memory/peak_mb", "sampling/trainer_sampler_ratio/mean",
                 "sampling/trainer_sampler_ratio/outside_0.9_1.1",
                 # the rollout pipeline's (rollout.max_staleness): the samples' policy age and the weight push
                 "staleness/mean", "staleness/max", "staleness/dropped_samples", "time/push"}


def _rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("options", [{}, {"loss_type": "grpo", "beta": 0.04}], ids=["dapo", "grpo-kl"])
def test_metric_names_are_trls(options, small_overrides, tmp_path, monkeypatch):
    trl = pytest.importorskip("trl")
    monkeypatch.syspath_prepend(str(SUPPORT))
    from integration_models import tiny_causal_lm, tiny_grpo_trainer

    # Given as a directory: TRL builds its KL reference model by loading the policy's path again.
    tiny_causal_lm("qwen2", seed=0).save_pretrained(tmp_path / "model")
    reference = tiny_grpo_trainer(trl.GRPOTrainer, str(tmp_path / "model"), tmp_path / "trl", disable_tqdm=True,
                                  **options)
    reference.train()
    trl_names = set().union(*(entry.keys() for entry in reference.state.log_history if "loss" in entry))

    overrides = {**small_overrides, "run.max_steps": 2, "rewards.functions": ["user_rewards:reward_short_digits"],
                 **{f"loss.{key}": value for key, value in options.items()}}
    train(load_config(overrides=overrides))
    steps = [row for row in _rows(overrides["run.output_dir"]) if "loss" in row]
    engine_names = set(steps[0])
    assert trl_names - engine_names == set(), "TRL logs these, the engine does not"
    assert engine_names - trl_names <= ENGINE_EXTRAS
    assert steps[1]["num_tokens"] > steps[0]["num_tokens"] > 0  # cumulative, as TRL's


@pytest.mark.slow
def test_evaluation_metrics_carry_the_eval_prefix(small_overrides):
    summary = train(load_config(overrides={**small_overrides, "run.max_steps": 2, "run.eval_steps": 1}))
    evaluations = [row for row in _rows(summary.run_dir) if "loss" not in row]
    assert [row["step"] for row in evaluations] == [0, 1, 2]  # step 0: the accuracy before training
    assert all(name.startswith("eval_") for row in evaluations for name in row if name != "step")
    assert "eval_accuracy" in evaluations[0]


def test_terminated_length_extremes():
    import torch

    metrics = completion_metrics(torch.tensor([3, 8, 5, 8]), torch.tensor([False, True, False, True]))
    assert (metrics["completions/min_terminated_length"], metrics["completions/max_terminated_length"]) == (3, 5)
    all_truncated = completion_metrics(torch.tensor([8, 8]), torch.tensor([True, True]))
    assert all_truncated["completions/min_terminated_length"] == all_truncated["completions/max_terminated_length"] == 0


@pytest.mark.slow
def test_nan_is_written_as_null_and_an_all_none_reward_warns(small_overrides, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(SUPPORT))
    overrides = {**small_overrides, "run.max_steps": 2, "rewards.functions": ["length", "user_rewards:always_none"]}
    train(load_config(overrides=overrides))
    text = (Path(overrides["run.output_dir"]) / "metrics.jsonl").read_text()
    rows = [row for row in (json.loads(line, parse_constant=pytest.fail) for line in text.splitlines())  # NaN would
            if "reward" in row]  # call it; the training rows (step 0 holds the evaluation before training)
    assert rows[0]["rewards/always_none/mean"] is None and math.isfinite(rows[0]["reward"])
    warnings = [line for line in capsys.readouterr().err.splitlines() if "'always_none' returned None" in line]
    assert len(warnings) == 1  # reported when it starts, not at every step


def test_health_warnings_say_what_they_mean():
    health = RunHealth(zero_std_steps=3)
    stuck = {"frac_reward_zero_std": 1.0, "grad_norm": 0.0, "rewards/f/mean": 0.0}
    assert health.check(1, stuck) == [] and health.check(2, stuck) == []
    (message,) = health.check(3, stuck)
    assert "frac_reward_zero_std has been 1 for 3 steps" in message and "every advantage is 0" in message
    assert health.check(4, stuck) == []  # the same stretch is reported once
    healthy = {"frac_reward_zero_std": 0.5, "grad_norm": 0.3}
    assert health.check(5, healthy) == []
    (message,) = health.check(6, {"frac_reward_zero_std": 0.5, "grad_norm": 0.0})
    assert "grad_norm is 0 at step 6" in message and "changed nothing" in message
    (message,) = health.check(7, {"frac_reward_zero_std": 0.5, "grad_norm": math.inf})
    assert "grad_norm is inf at step 7" in message and "overflowed" in message


def test_a_step_with_no_token_in_the_loss_is_said_and_a_vanished_gradient_names_its_cause():
    """Every completion truncated and masked out: said at the step it happens (before, nothing was said while the
    rewards were equal, and a grad_norm of 0 blamed the masking even when the loss held tokens)."""
    health = RunHealth()
    masked = {"frac_reward_zero_std": 1.0, "grad_norm": 0.0, "completions/clipped_ratio": 1.0}
    (message,) = health.check(1, masked, loss_tokens=0)
    assert message.startswith("no completion token is in the loss at step 1") and \
        "rollout.mask_truncated_completions" in message and "completions/clipped_ratio 1.0" in message
    assert health.check(2, masked, loss_tokens=0) == []  # said once per stretch
    saturated = {"frac_reward_zero_std": 0.5, "grad_norm": 0.0, "entropy": 4.595}
    (message,) = health.check(3, saturated, loss_tokens=61)
    assert "grad_norm is 0 at step 3" in message and "The loss holds 61 completion tokens" in message and \
        "saturated" in message and "mask_truncated" not in message


def test_a_reward_that_scores_nothing_is_reported_as_none_or_nan():
    health = RunHealth()
    (message,) = health.check(1, {"rewards/f/mean": math.nan, "rewards/g/mean": 0.5})
    assert "reward function 'f' returned None or NaN for every completion at step 1" in message


def test_a_run_where_no_completion_can_be_scored_stops():
    health = RunHealth(unscored_steps=3)
    unscored = {"rewards/f/mean": math.nan, "rewards/g/mean": None}
    assert len(health.check(1, unscored)) == 2  # one warning per function
    assert health.check(2, {**unscored, "rewards/g/mean": 0.0}) == []  # g scored something: the streak ends
    assert len(health.check(3, unscored)) == 1 and health.check(4, unscored) == []  # g's warning again
    with pytest.raises(UnscoredRunError, match="no completion could be scored at steps 3-5: every reward "
                                               "function returned None or NaN for every completion"):
        health.check(5, unscored)


@pytest.mark.slow
def test_training_stops_when_no_completion_can_be_scored(small_overrides, monkeypatch):
    monkeypatch.syspath_prepend(str(SUPPORT))
    overrides = {**small_overrides, "run.max_steps": 6, "rewards.functions": ["user_rewards:always_nan"]}
    with pytest.raises(UnscoredRunError, match="steps 1-3"):
        train(load_config(overrides=overrides))
    assert [row["step"] for row in _rows(overrides["run.output_dir"]) if "loss" in row] == [1, 2, 3]
