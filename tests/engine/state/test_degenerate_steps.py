"""Runs whose data leave them nothing to learn, said once from the step statistics: every group's rewards equal,
every completion cut at the length limit, every completion empty. A short run is said at its last step; a long one
once the condition has lasted; never at every step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

from grpo_engine.config import load_config
from grpo_engine.data.demo_task import build_char_tokenizer, build_tiny_model
from grpo_engine.state.health import SHORT_RUN_STEPS, RunHealth
from grpo_engine.trainer import train

STEPS = 5  # RunHealth(zero_std_steps=STEPS): "many steps" in these tests
CONDITIONS = {  # the metrics that make a condition hold, and how its warning starts
    "zero_std": ({"frac_reward_zero_std": 1.0}, "frac_reward_zero_std has been 1 for "),
    "truncated": ({"completions/clipped_ratio": 1.0, "completions/max_length": 8.0},
                  "completions/clipped_ratio has been 1 for "),
}
HEALTHY = {"frac_reward_zero_std": 0.5, "completions/clipped_ratio": 0.5, "completions/max_length": 8.0,
           "grad_norm": 0.3}


@settings(max_examples=150, deadline=None)
@given(condition=st.sampled_from(sorted(CONDITIONS)), holds=st.lists(st.booleans(), min_size=1, max_size=14))
def test_a_lasting_condition_is_said_once_when_it_has_lasted_or_has_filled_the_whole_run(condition, holds):
    metrics, opening = CONDITIONS[condition]
    health = RunHealth(zero_std_steps=STEPS)
    said = []
    for step, held in enumerate(holds, start=1):
        messages = health.check(step, {**HEALTHY, **metrics} if held else HEALTHY, loss_tokens=10.0,
                                last=step == len(holds))
        said += [step for message in messages if message.startswith(opening)]
        assert all("\n" not in message for message in messages)
    expected, streak = [], 0
    for step, held in enumerate(holds, start=1):
        streak = streak + 1 if held else 0
        if streak == STEPS or (step == len(holds) == streak < STEPS and streak >= SHORT_RUN_STEPS):
            expected.append(step)  # once per stretch: at its STEPS-th step, or at the end of a run it fills (a run
            # of one or two steps, a smoke test of the set-up, is not told)
    assert said == expected, (holds, said)


def test_all_truncated_is_left_to_the_masked_loss_warning_when_no_token_is_in_the_loss():
    health = RunHealth(zero_std_steps=1)
    messages = health.check(1, {"completions/clipped_ratio": 1.0, "completions/max_length": 8.0}, loss_tokens=0)
    assert not any(m.startswith("completions/clipped_ratio has been 1") for m in messages)
    assert any(m.startswith("no completion token is in the loss") for m in messages)


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=6), min_size=1, max_size=6),
       limit=st.integers(1, 4))
def test_steps_whose_completions_are_all_empty_are_said_when_they_start(lengths, limit):
    """A completion's length counts its EOS token; one that is that token alone (length 1, ending before the limit)
    is empty. Said when a step holds only those, again only after a step that did not."""
    health, said, before = RunHealth(), [], False
    for step, step_lengths in enumerate(lengths, start=1):
        truncated = [n == limit and limit > 1 for n in step_lengths]  # ended at the limit with no EOS
        if limit == 1:
            truncated = [False] * len(step_lengths)  # one token: its EOS (a limit of 1 that cut text is below)
        metrics = {"completions/max_length": float(max(step_lengths)),
                   "completions/clipped_ratio": sum(truncated) / len(truncated)}
        messages = [m for m in health.check(step, metrics, loss_tokens=1.0) if m.startswith("every completion at")]
        empty = all(n == 1 and not t for n, t in zip(step_lengths, truncated))
        assert (messages != []) == (empty and not before), (step_lengths, messages)
        if messages:
            assert f"at step {step} is empty" in messages[0] and "\n" not in messages[0]
        before = empty
    cut = health.check(len(lengths) + 1, {"completions/max_length": 1.0, "completions/clipped_ratio": 1.0})
    assert not any(m.startswith("every completion at") for m in cut)  # one token of text, cut at a limit of 1


# ---- end to end on the tiny model

def _warnings(capsys, caplog) -> tuple[list[str], list[str]]:
    """(the start's warnings, logged; the steps' warnings, written to stderr under the progress bar)."""
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("warning: ")]
    written = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    return logged, [line for line in written if line not in logged]


def test_a_short_run_with_a_constant_reward_says_so_once(small_overrides, capsys, caplog):
    overrides = {**small_overrides, "rewards.functions": ["math_accuracy"], "rewards.math_correct": 0.5,
                 "rewards.math_wrong": 0.5, "rewards.math_no_answer": 0.5}
    train(load_config(overrides=overrides))
    start, said = _warnings(capsys, caplog)
    assert sum("no reward function can tell the completions of a prompt apart" in line for line in start) == 1
    zero_std = [line for line in said if "frac_reward_zero_std has been 1 for 3 steps (up to step 3)" in line]
    assert len(zero_std) == 1, said
    rows = [json.loads(line) for line in (Path(overrides["run.output_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert all(row["frac_reward_zero_std"] == 1.0 for row in rows if "reward" in row)


@pytest.fixture(scope="module")
def eos_first_model_dir(tmp_path_factory) -> Path:
    """The built-in model made to put its EOS token first every time: the last attention layer adds one large
    constant to the residual stream (value bias, output projection onto one dimension), which the (tied) head reads
    as EOS only."""
    path = tmp_path_factory.mktemp("eos_first_model")
    tokenizer = build_char_tokenizer()
    lm = build_tiny_model(tokenizer, seed=0)
    with torch.no_grad():
        attention = lm.model.layers[-1].self_attn
        attention.v_proj.weight.zero_()
        attention.v_proj.bias.fill_(100.0)
        attention.o_proj.weight.zero_()
        attention.o_proj.weight[0, :] = 1.0
        lm.lm_head.weight.zero_()
        lm.lm_head.weight[tokenizer.eos_token_id, 0] = 50.0
    lm.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_a_run_whose_completions_are_all_empty_says_so_once(small_overrides, eos_first_model_dir, capsys, caplog):
    train(load_config(overrides={**small_overrides, "model.name_or_path": str(eos_first_model_dir),
                                 "rewards.functions": ["length"], "rewards.length_cache": 0}))
    _, said = _warnings(capsys, caplog)
    empty = [line for line in said if line.startswith("warning: every completion at step 1 is empty")]
    assert len(empty) == 1 and not any("every completion at step 2" in line for line in said), said
