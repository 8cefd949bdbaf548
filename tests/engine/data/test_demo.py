"""The built-in demo: its warm start, a shortened run that learns, and (opt-in, `-m demo`) the full promise."""

from __future__ import annotations

import json
import math

import pytest
import torch

from grpo_engine.config import load_config
from grpo_engine.data.demo_task import (
    DEMO_PRESET,
    addition_problems,
    build_char_tokenizer,
    build_tiny_model,
    reference_completion,
)
from grpo_engine.data.warm_start import reference_answer_probability, supervised_warm_start, teacher_forced_batch
from grpo_engine.model.loading import HiddenStatePolicy
from grpo_engine.tools.demo_seeds import SeedResult, format_table, reward_windows, run_seed
from grpo_engine.trainer import train


def _problems(max_operand: int):
    rows, _ = addition_problems(max_operand, 0, seed=0)
    return [r["prompt"] for r in rows], [reference_completion(r) for r in rows]


def test_warm_start_stops_once_the_reference_answers_reach_the_target():
    tokenizer = build_char_tokenizer()
    lm = build_tiny_model(tokenizer, seed=0)
    prompts, targets = _problems(2)
    result = supervised_warm_start(lm, tokenizer, prompts, targets, steps=300, learning_rate=3e-3, batch_size=16,
                                   seed=0, device=torch.device("cpu"), backend="torch", target=0.3, check_every=5)
    assert 0 < len(result.losses) < 300 and len(result.losses) % 5 == 0
    assert result.losses[-1] < result.losses[0]
    # The reported probability is the model's: recomputed here, in float64, from full-vocabulary logits.
    batch = teacher_forced_batch(tokenizer, prompts, targets, torch.device("cpu"))
    with torch.no_grad():
        logits = lm.double()(batch.input_ids, attention_mask=batch.attention_mask).logits
    P = batch.prompt_ids.shape[1]
    logps = logits[:, P - 1:-1].log_softmax(-1).gather(-1, batch.completion_ids[..., None])[..., 0]
    expected = ((logps * batch.completion_mask).sum(1).exp().mean().item())
    assert result.answer_probability == pytest.approx(expected, abs=1e-4)
    assert 0.3 <= result.answer_probability < 0.9  # stopped near the target, not run to the end
    assert reference_answer_probability(HiddenStatePolicy(lm.float()), batch, "torch") == pytest.approx(expected,
                                                                                                       abs=1e-4)


def test_warm_start_target_must_be_a_probability():
    tokenizer = build_char_tokenizer()
    with pytest.raises(ValueError, match=r"warm start target must be in \(0, 1\], got 1.5"):
        supervised_warm_start(build_tiny_model(tokenizer, 0), tokenizer, ["1+1="], ["\\boxed{2}"], 1, 1e-3, 1, 0,
                              torch.device("cpu"), target=1.5)


@pytest.mark.slow
def test_shortened_demo_learns(tmp_path):
    """The demo's own settings on the 3x3 problems, 30 steps: sampled accuracy rises by a clear margin."""
    config = load_config(overrides={
        "run.output_dir": str(tmp_path / "run"), "run.max_steps": 30, "run.progress_bar": False,
        "run.plot": False, "run.save_steps": 0, "run.log_completions_steps": 0, "run.warm_start_target": 0.3,
        "data.builtin_max_operand": 2, "run.eval_num_samples": 16,
        "run.seed": 42,  # the seed this shortened run's margin was measured at (the preset's is now 0)
    }, preset=DEMO_PRESET)
    summary = train(config)
    before, after = summary.eval_before["accuracy"], summary.eval_after["accuracy"]
    assert before < 0.6 and after >= before + 0.25, (before, after)


def test_reward_windows_are_tenths_of_the_run():
    rewards = [0.0] * 10 + [1.0] * 70 + [0.5] * 20
    first, last, best = reward_windows(rewards)
    assert (first, last, best) == (0.0, 0.5, 1.0)
    with pytest.raises(ValueError, match="at least one step"):
        reward_windows([])


def test_table_flags_a_late_collapse_and_a_missed_target():
    good = SeedResult(0, 0.5, 0.97, 0.5, 1.0, -0.2, 0.9, 0.92, 60.0, 55.0)
    collapsed = SeedResult(1, 0.5, 0.97, 0.5, 1.0, -0.2, 0.8, 0.9, 60.0, 55.0)
    weak = SeedResult(2, 0.5, 0.9, 0.5, 1.0, -0.2, 0.8, 0.8, 60.0, 55.0)
    assert good.passed and not collapsed.no_late_collapse and not collapsed.passed and not weak.passed
    rows = format_table([good, collapsed, weak]).splitlines()
    assert rows[2].endswith("| yes | 60.0 | 55.0 | yes |") and "| NO |" in rows[3] and rows[4].endswith("| NO |")
    assert math.isclose(weak.reward_best - weak.reward_last, 0.0)


@pytest.mark.demo
def test_full_demo_meets_its_targets(request, tmp_path):
    """`grpo-engine train` with no arguments, seed 0: >= 0.95 sampled, >= 0.98 greedy, no late collapse."""
    if "demo" not in (request.config.getoption("-m") or ""):
        pytest.skip("a full demo run: select it with -m demo")
    result = run_seed(0, tmp_path, [])
    assert result.sampled_before < 0.8, result  # RL, not the warm start, does the learning
    assert result.passed, result


def test_eval_without_data_scores_the_demo_task(tiny_model_dir, tmp_path):
    """`grpo-engine eval --model M` on a demo checkpoint scores the demo's 36 problems, not the 0..9 table."""
    from grpo_engine.cli import main

    output = tmp_path / "eval.json"
    assert main(["eval", "--model", str(tiny_model_dir), "--output", str(output)]) == 0
    assert json.loads(output.read_text())["num_prompts"] == (DEMO_PRESET["data"]["builtin_max_operand"] + 1) ** 2 == 36
