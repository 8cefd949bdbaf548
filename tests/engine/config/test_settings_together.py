"""Settings each valid alone but not together: the run says so at its start (a setting that changes nothing where
another makes it unread), or refuses before any work (a combination that cannot run), and the saying is exact:
each warning is checked against what the objective, the schedule and the trainer's intervals actually compute."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from grpo_engine.config import ConfigError, apply_overrides, config_from_dict, validate
from grpo_engine.config.applicability import inapplicable_settings
from grpo_engine.config.schema import MAX_SEED
from grpo_engine.run_setup import lr_lambda
from grpo_kernels.losses import BUILTIN_LOSS_TYPES
from grpo_kernels import grpo_objective

pytestmark = pytest.mark.filterwarnings("ignore:.*importance_sampling_level=:UserWarning")

MODEL = {"model.name_or_path": "org/model"}  # a named model: the schema's defaults, no demo preset
DEFAULTS = config_from_dict(apply_overrides({}, MODEL))


def build(overrides: dict):
    return config_from_dict(apply_overrides({}, {**MODEL, **overrides}))


def named(config, key: str) -> bool:
    return any(note.startswith(f"{key} is set (") for note in inapplicable_settings(config, DEFAULTS))


# ---- the ratio's bounds: read only by a loss type that clips, and only where the ratio can leave 1

def _loss_and_grad(config, reused: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    lp = (-torch.rand(6, 5, generator=g) * 3).requires_grad_(True)
    mask = torch.ones(6, 5)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    # a batch's second pass: log-probs moved by up to 2 nats since they were sampled (ratios e^-2 .. e^2)
    old = (lp.detach() + (torch.rand(6, 5, generator=g) * 4 - 2)) if reused else None
    loss, _ = grpo_objective(lp, torch.zeros(6, 5), mask, advantages, config.loss_config(), old_logps=old)
    loss.backward()
    return loss.detach(), lp.grad


@settings(max_examples=60, deadline=None)
@given(loss_type=st.sampled_from(BUILTIN_LOSS_TYPES), iterations=st.integers(1, 3),
       bound=st.sampled_from([("loss.epsilon", 0.0), ("loss.epsilon", 0.5), ("loss.epsilon_high", 0.05),
                              ("loss.epsilon_high", 3.0), ("loss.delta", 1.1)]),
       epsilon_high=st.sampled_from([None, 0.4]))
def test_a_ratio_bound_is_said_to_change_nothing_exactly_where_the_objective_ignores_it(loss_type, iterations,
                                                                                       bound, epsilon_high):
    key, value = bound
    base = {"loss.loss_type": loss_type, "optim.num_iterations": iterations}
    if key != "loss.epsilon_high":
        base["loss.epsilon_high"] = epsilon_high
    config, reference = build({**base, key: value}), build(base)
    changed = [not torch.equal(a, b) for a, b in zip(_loss_and_grad(config, iterations > 1),
                                                     _loss_and_grad(reference, iterations > 1))]
    assert named(config, key) == (not any(changed)), (key, value, loss_type, iterations, changed)


def test_the_note_names_the_setting_that_makes_a_ratio_bound_read():
    notes = inapplicable_settings(build({"loss.epsilon": 0.1}), DEFAULTS)
    assert any("loss.epsilon is set (0.1)" in note and "optim.num_iterations > 1" in note for note in notes), notes
    notes = inapplicable_settings(build({"loss.loss_type": "sapo", "optim.num_iterations": 2,
                                         "loss.epsilon_high": 0.28}), DEFAULTS)
    assert any("loss.epsilon_high is set (0.28)" in note and "loss.loss_type" in note for note in notes), notes


# ---- step intervals and the warmup: read only where the run reaches one of their steps

# What the trainer does every k steps of run.max_steps: (its key, whether the last step does it anyway)
INTERVALS = [("run.save_steps", True), ("run.eval_steps", True), ("run.log_completions_steps", False)]


@settings(max_examples=80, deadline=None)
@given(interval=st.sampled_from(INTERVALS), every=st.integers(1, 400), max_steps=st.integers(1, 300))
def test_a_step_interval_is_said_to_change_nothing_exactly_where_the_run_reaches_none_of_its_steps(
        interval, every, max_steps):
    key, last_does_it = interval
    config = build({key: every, "run.max_steps": max_steps, "data.eval_path": "org/eval"})
    steps = [step for step in range(1, max_steps + 1)
             if step % every == 0 and not (last_does_it and step == max_steps)]
    at_default = every == getattr(DEFAULTS.run, key.split(".")[1])  # a setting left at its default is not named
    assert named(config, key) == (not steps and not at_default)
    if not steps and not at_default:
        note = next(n for n in inapplicable_settings(config, DEFAULTS) if n.startswith(key))
        assert "run.max_steps" in note


@settings(max_examples=80, deadline=None)
@given(ratio=st.floats(0.001, 0.999), max_steps=st.integers(1, 200), iterations=st.integers(1, 4),
       kind=st.sampled_from(["constant", "linear", "cosine"]))
def test_a_warmup_ratio_is_said_to_change_nothing_exactly_where_the_schedule_has_no_warmup_step(
        ratio, max_steps, iterations, kind):
    config = build({"optim.warmup_ratio": ratio, "run.max_steps": max_steps, "optim.num_iterations": iterations,
                    "optim.lr_scheduler_type": kind})
    total = config.optimizer_steps()
    scheduled = [lr_lambda(kind, config.warmup_steps(), total)(step) for step in range(total)]
    without = [lr_lambda(kind, 0, total)(step) for step in range(total)]
    assert named(config, "optim.warmup_ratio") == (scheduled == without)


# ---- the seed: every process seeds its RNGs with run.seed + its index

@settings(max_examples=60, deadline=None)
@given(processes=st.integers(1, 16), below_the_top=st.integers(0, 20))
def test_a_seed_no_process_can_take_is_refused_before_any_work_naming_it(processes, below_the_top):
    seed = MAX_SEED - below_the_top
    config = build({"run.seed": seed, "optim.per_device_train_batch_size": 8})
    takes = True
    try:
        for index in range(processes):
            np.random.seed(seed + index)  # what accelerate's set_seed does on each process
    except ValueError:
        takes = False
    if takes:
        validate(config, processes)
        return
    with pytest.raises(ConfigError) as caught:
        validate(config, processes)
    message = str(caught.value)
    assert message.startswith("run.seed (") and "\n" not in message and str(MAX_SEED - processes + 1) in message
