"""Settings each valid, and valid together, that leave the run nothing to learn: one warning line at the start, and
the warning is exact, each checked against what the rewards, the sampler and AdamW actually compute."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, example, given, settings, strategies as st
from transformers import AutoModelForCausalLM

from grpo_engine.config import apply_overrides, config_from_dict
from grpo_engine.config.degenerate import KEPT_BY_DECAY, degenerate_settings, schedule_sum
from grpo_engine.run_setup import lr_lambda
from grpo_engine.steps.rewards import load_reward_functions

MODEL = {"model.name_or_path": "org/model"}
ALL_SAME = "no reward function can tell the completions of a prompt apart"


def build(overrides: dict):
    return config_from_dict(apply_overrides({}, {**MODEL, **overrides}))


# ---- rewards that give every completion of a prompt the same reward

MAX_NEW_TOKENS = 6
# Completions that reach every outcome of the built-in rewards: right, wrong and no answer, each length up to the limit
COMPLETIONS = [("\\boxed{2}", 1), ("\\boxed{3}", 2), ("no box", MAX_NEW_TOKENS), ("", MAX_NEW_TOKENS - 1),
               ("<think>a</think><answer>2</answer>", 3)]


def weighted_rewards(config) -> list[float]:
    """The weighted reward of each completion of one prompt (answer 2), computed by the run's own functions."""
    rewards = load_reward_functions(config.rewards, MAX_NEW_TOKENS)
    texts = [text for text, _ in COMPLETIONS]
    ids = [[7] * length for _, length in COMPLETIONS]
    total = [0.0] * len(texts)
    for reward in rewards:
        scores = reward.fn(prompts=["1+1="] * len(texts), completions=texts, completion_ids=ids,
                           answer=["2"] * len(texts))
        total = [t + reward.weight * (s or 0.0) for t, s in zip(total, scores)]
    return total


VALUES = st.sampled_from([-1.0, 0.0, 0.5, 1.0])


@settings(max_examples=120, deadline=None)
@given(functions=st.lists(st.sampled_from(["math_accuracy", "length", "format"]), min_size=1, max_size=3,
                          unique=True),
       values=st.tuples(VALUES, VALUES, VALUES), cache=st.integers(0, MAX_NEW_TOKENS),
       weights=st.one_of(st.none(), st.lists(st.sampled_from([0.0, 1.0, 2.0]), min_size=3, max_size=3)))
def test_a_reward_said_to_be_the_same_for_every_completion_is_so_and_only_then(functions, values, cache, weights):
    if weights is not None and not any(weights[:len(functions)]):
        weights = None  # all 0 is refused by the schema (tested there)
    config = build({"rewards.functions": functions, "rewards.math_correct": values[0], "rewards.math_wrong": values[1],
                    "rewards.math_no_answer": values[2], "rewards.length_cache": cache,
                    "rollout.max_new_tokens": MAX_NEW_TOKENS,
                    "rewards.weights": None if weights is None else weights[:len(functions)]})
    notes = degenerate_settings(config)
    run_said = [note for note in notes if note.startswith(ALL_SAME)]
    assert (len(run_said) == 1) == (len(set(weighted_rewards(config))) == 1), (notes, weighted_rewards(config))
    assert all("\n" not in note for note in notes)
    # each function said to be constant alone is constant: its own rewards over the completions are all equal
    for name in functions:
        alone = build({"rewards.functions": [name], "rewards.math_correct": values[0],
                       "rewards.math_wrong": values[1], "rewards.math_no_answer": values[2],
                       "rewards.length_cache": cache, "rollout.max_new_tokens": MAX_NEW_TOKENS})
        if any(note.startswith(f"reward function {name!r} gives every completion the same reward") for note in notes):
            assert len(set(weighted_rewards(alone))) == 1


def test_the_note_names_each_function_and_why():
    (note,) = degenerate_settings(build({"rewards.functions": ["math_accuracy", "length"], "rewards.weights": [0, 1],
                                         "rewards.length_cache": 0}))
    assert "'math_accuracy': rewards.weights gives it 0" in note and "'length': rewards.length_cache is 0" in note \
        and "every advantage is 0" in note


# ---- greedy sampling: the completions of a prompt are all the same

@pytest.fixture(scope="module")
def tiny_lm(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@settings(max_examples=6, deadline=None)
@given(top_k=st.integers(1, 4), seed=st.integers(0, 1000))
def test_top_k_1_is_said_exactly_where_the_group_is_all_the_same(top_k, seed, tiny_lm):
    config = build({"rollout.top_k": top_k, "rollout.replay_kept_tokens": False})
    said = [note for note in degenerate_settings(config) if note.startswith("rollout.top_k 1 ")]
    torch.manual_seed(seed)
    with torch.no_grad():
        out = tiny_lm.generate(torch.tensor([[20, 14, 21, 30]]), do_sample=True, top_k=top_k, top_p=1.0,
                               max_new_tokens=8, num_return_sequences=config.rollout.num_generations,
                               pad_token_id=0)
    identical = bool((out == out[0]).all())
    assert bool(said) == (top_k == 1)
    if top_k == 1:
        assert identical and str(config.rollout.num_generations) in said[0]


# ---- clipping below AdamW's epsilon: the step cannot reach the learning rate

@settings(max_examples=40, deadline=None)
@given(max_grad_norm=st.floats(1e-12, 1.0), adam_epsilon=st.floats(1e-10, 1e-3), seed=st.integers(0, 2**16))
def test_a_clip_below_adam_epsilon_is_said_with_the_bound_the_steps_keep(max_grad_norm, adam_epsilon, seed):
    config = build({"optim.max_grad_norm": max_grad_norm, "optim.adam_epsilon": adam_epsilon})
    said = [note for note in degenerate_settings(config) if note.startswith("optim.max_grad_norm ")]
    assert bool(said) == (max_grad_norm < adam_epsilon)
    generator = torch.Generator().manual_seed(seed)
    weight = torch.nn.Parameter(torch.randn(32, generator=generator, dtype=torch.float64))
    lr = 1.0
    optimizer = torch.optim.AdamW([weight], lr=lr, eps=adam_epsilon, weight_decay=0.0)
    largest = 0.0
    for _ in range(5):
        before = weight.detach().clone()
        weight.grad = torch.randn(32, generator=generator, dtype=torch.float64) * 10.0 ** float(
            torch.randint(-6, 3, (1,), generator=generator))
        torch.nn.utils.clip_grad_norm_([weight], max_grad_norm)
        optimizer.step()
        largest = max(largest, float((weight.detach() - before).abs().max()))
    bound = lr * max_grad_norm / adam_epsilon
    assert largest <= bound * (1 + 1e-6)  # the note's bound holds whatever the gradients
    if said:
        assert f"at most {max_grad_norm / adam_epsilon:.2g} of optim.learning_rate" in said[0]


# ---- weight decay that erases the weights whatever the gradient

@settings(max_examples=80, deadline=None)
@given(max_steps=st.integers(1, 400), iterations=st.integers(1, 3), ratio=st.floats(0, 0.99),
       kind=st.sampled_from(["constant", "linear", "cosine"]))
def test_the_schedule_sum_is_the_sum_of_the_schedule(max_steps, iterations, ratio, kind):
    config = build({"run.max_steps": max_steps, "optim.num_iterations": iterations, "optim.warmup_ratio": ratio,
                    "optim.lr_scheduler_type": kind})
    factor = lr_lambda(kind, config.warmup_steps(), config.optimizer_steps())
    assert math.isclose(schedule_sum(config), sum(factor(t) for t in range(config.optimizer_steps())),
                        rel_tol=1e-9, abs_tol=1e-9)


@settings(max_examples=60, deadline=None)
@given(lr_exponent=st.floats(-4, 0.5), decay_exponent=st.floats(-3, 2), max_steps=st.integers(1, 60),
       kind=st.sampled_from(["constant", "linear", "cosine"]), ratio=st.sampled_from([0.0, 0.3]))
@example(lr_exponent=-2, decay_exponent=2, max_steps=3, kind="constant", ratio=0.0)  # 1e-2 x 100: zeroes at once
def test_weight_decay_is_said_to_erase_the_weights_exactly_where_a_real_adamw_does(
        lr_exponent, decay_exponent, max_steps, kind, ratio):
    lr, decay = 10.0 ** lr_exponent, 10.0 ** decay_exponent
    assume(lr * decay <= 1)  # a larger product is refused by the schema (test_config_bounds.py)
    config = build({"optim.learning_rate": lr, "optim.weight_decay": decay, "run.max_steps": max_steps,
                    "optim.lr_scheduler_type": kind, "optim.warmup_ratio": ratio})
    said = [note for note in degenerate_settings(config) if "optim.weight_decay" in note]
    # what AdamW's decay leaves of a weight the gradient never reaches (a gradient of 0), the engine's schedule
    weight = torch.nn.Parameter(torch.ones(1, dtype=torch.float64))
    optimizer = torch.optim.AdamW([weight], lr=lr, weight_decay=decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(kind, config.warmup_steps(),
                                                                       config.optimizer_steps()))
    flipped = False
    for _ in range(config.optimizer_steps()):
        before = float(weight)
        weight.grad = torch.zeros(1, dtype=torch.float64)
        optimizer.step()
        scheduler.step()
        flipped |= float(weight) * before <= 0
    kept = abs(float(weight))
    if lr * decay >= 1:
        assert flipped and len(said) == 1 and "zeroing it" in said[0]
    elif said:
        assert kept < KEPT_BY_DECAY and "leaves at most" in said[0]
        bound = float(said[0].split("leaves at most ")[1].split(" ")[0])
        assert kept <= bound * 1.05  # the bound, shown to 2 digits
    else:
        # exp(-x / (1 - x)) <= 1 - x: what the decay leaves is at least the bound's value to the power 1 / (1 - rate)
        assert kept >= KEPT_BY_DECAY ** (1 / (1 - lr * decay)) * (1 - 1e-9)
