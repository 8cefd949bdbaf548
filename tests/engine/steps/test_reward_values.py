"""Whatever a reward function returns is read as a score or refused in one bounded line naming the function, the
completion and the dataset row it scored, and what was expected: numbers of any size and kind, non-numbers, objects
whose repr misbehaves (hypothesis)."""

from __future__ import annotations

import decimal
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from grpo_engine.steps.rewards import NamedReward, RewardFunctionError, score_completions

FLOAT64_MAX = np.finfo(np.float64).max


class BrokenRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class BrokenFloat(float):
    """A number type whose float() raises, whatever it raises (a RuntimeError escaped the reading before)."""

    error: type = RuntimeError

    def __float__(self) -> float:
        raise self.error("no float")


def broken_float(error: type) -> BrokenFloat:
    return type("BrokenFloat", (BrokenFloat,), {"error": error})(1.0)


class HugeRepr:
    def __repr__(self) -> str:
        return "x" * 10**6


def _expected_score(value):
    """The score the engine must take from `value`, NaN for "not scored", or None when it must refuse it."""
    if isinstance(value, (np.ndarray, torch.Tensor)):
        if value.ndim or (isinstance(value, torch.Tensor) and value.is_meta):
            return None
        value = value.item()
    if value is None:
        return math.nan
    if isinstance(value, BrokenFloat):
        return None
    if isinstance(value, (bool, np.bool_, int, float, Fraction, np.integer, np.floating)):
        try:
            number = float(value)
        except OverflowError:
            return None
        return number if math.isfinite(number) or math.isnan(number) else None
    return None


numbers = st.one_of(
    st.integers(min_value=-(2**1100), max_value=2**1100),
    st.integers(min_value=1, max_value=5000).map(lambda e: 10**e), st.integers(min_value=1, max_value=5000).map(
        lambda e: -(10**e)),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
    st.fractions(max_denominator=10**6), st.integers(min_value=300, max_value=2000).map(lambda e: Fraction(10**e, 7)),
    st.floats(allow_nan=False, allow_infinity=True, width=32).map(np.float32),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(np.int64),
    st.floats(allow_infinity=True).map(lambda x: torch.tensor(x, dtype=torch.float64)),
)
non_numbers = st.one_of(
    st.text(max_size=5000), st.binary(max_size=50), st.complex_numbers(), st.just(decimal.Decimal("1.5")),
    st.lists(st.integers(), max_size=3000), st.dictionaries(st.text(max_size=3), st.integers(), max_size=3),
    st.just(BrokenRepr()), st.just(HugeRepr()), st.just(object()), st.just(np.zeros(3)), st.just(torch.zeros(2, 2)),
    st.just(torch.empty((), device="meta")),  # a 0-d tensor with no value to read
    st.just((x for x in [1.0])),  # a generator: not a number, however many it would yield
    st.sampled_from([RuntimeError, KeyError, AttributeError, ValueError, TypeError, ZeroDivisionError]).map(
        broken_float),
)


def _score(values, n):
    """`values` scored for n completions, completion i from row 10 + i of d.jsonl."""
    reward = NamedReward("my_reward", lambda prompts, completions, **_: values, 1.0)
    return score_completions([reward], ["p"] * n, ["c"] * n, {}, [[1]] * n,
                             [f"dataset 'd.jsonl' row {10 + i}" for i in range(n)])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(numbers, non_numbers), min_size=1, max_size=4))
def test_every_returned_value_is_a_score_or_one_bounded_line(values):
    expected = [_expected_score(v) for v in values]
    if all(e is not None for e in expected):
        table = _score(values, len(values))
        assert all((math.isnan(e) and math.isnan(s)) or s == e for e, s in zip(expected, table[:, 0].tolist()))
        return
    with pytest.raises(RewardFunctionError) as caught:
        _score(values, len(values))
    message = str(caught.value)
    first_bad = next(i for i, e in enumerate(expected) if e is None)
    assert "\n" not in message and len(message) < 400, message
    assert message.startswith("reward function 'my_reward' returned ")
    assert (f"for completion {first_bad} (dataset 'd.jsonl' row {10 + first_bad}); expected a finite number"
            in message), message


@settings(max_examples=50, deadline=None)
@given(st.one_of(non_numbers, st.integers(min_value=2, max_value=9).map(lambda k: [0.0] * k), numbers))
def test_a_return_that_is_not_one_value_per_completion_is_one_bounded_line(returned):
    with pytest.raises(RewardFunctionError) as caught:
        _score(returned, 1) if not isinstance(returned, (list, tuple)) else _score(returned, len(returned) + 1)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400, message
    assert message.startswith("reward function 'my_reward' must return a list of")


@pytest.mark.parametrize("value, shown", [(10**400, "an integer of 1329 bits (about 10**400)"),
                                          (Fraction(10**400, 3), "Fraction(1000"), (float("inf"), "inf")])
def test_a_number_past_float64_is_named_with_its_size(value, shown):
    with pytest.raises(RewardFunctionError, match="expected a finite number") as caught:
        _score([value], 1)
    assert shown in str(caught.value)
    assert 2.0**1023 < FLOAT64_MAX  # the bound the message names (about 1.8e308)


@pytest.mark.slow
@pytest.mark.parametrize("role", ["train", "eval"])
def test_a_training_run_names_the_dataset_row_whose_completion_got_a_bad_value(role, small_overrides, tmp_path,
                                                                               monkeypatch):
    """The row the message names is the row of the data holding that prompt, whatever order the sampler drew."""
    import json

    from grpo_engine.config import load_config
    from grpo_engine.trainer import train
    from repo_paths import SUPPORT

    monkeypatch.syspath_prepend(str(SUPPORT))
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text("".join(json.dumps({"prompt": f"{a}+1=", "answer": str(a + 1)}) + "\n" for a in (1, 2, 3, 4)))
    bad.write_text("".join(json.dumps({"prompt": p, "answer": "0"}) + "\n" for p in ("1+1=", "2+2=", "7+7=", "3+3=")))
    data = {"data.path": str(bad)} if role == "train" else {"data.path": str(good), "data.eval_path": str(bad)}
    config = load_config(overrides={**small_overrides, **data, "run.max_steps": 3, "data.shuffle": True,
                                    "rollout.num_generations": 2, "optim.per_device_train_batch_size": 4,
                                    "rewards.functions": ["user_rewards:text_for_seven"]})
    with pytest.raises(RewardFunctionError) as caught:
        train(config)
    message = str(caught.value)
    assert "\n" not in message and f"(dataset {str(bad)!r} row 2); expected a finite number" in message, message


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-5, 5), st.booleans()), min_size=1, max_size=6),
       st.sampled_from([np.float64, np.float32, np.int64, np.bool_]))
def test_a_masked_element_of_a_numpy_masked_array_is_not_scored(pairs, dtype):
    """NumPy's reading of a masked element: missing. Its value was read as 0.0 before (a score of 0, silently)."""
    values = np.ma.masked_array([dtype(v) for v, _ in pairs], mask=[m for _, m in pairs])
    scores = _score(values, len(pairs))[:, 0].tolist()
    for (value, masked), score in zip(pairs, scores):
        assert math.isnan(score) if masked else score == float(dtype(value)), (pairs, scores)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=4),
       st.sampled_from([lambda c: c[0]["content"], lambda c: c["content"], lambda c: c[-1]["content"]]))
def test_a_reward_written_for_trls_chat_messages_is_told_it_gets_text(completions, read):
    """TRL passes a conversational dataset's completions as lists of messages; the engine passes text. Before, the
    error named only string indices."""
    reward = NamedReward("chat_reward", lambda prompts, completions, **_: [float(len(read(c))) for c in completions],
                         1.0)
    with pytest.raises(RewardFunctionError) as caught:
        score_completions([reward], ["p"] * len(completions), completions, {}, [[1]] * len(completions))
    message = str(caught.value)
    assert "\n" not in message and "raised TypeError" in message and "not as TRL's lists of chat messages" in message
