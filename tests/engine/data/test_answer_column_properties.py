"""A reference answer math_accuracy can score against. An answer that leaves nothing once read (blank text, GSM8K's
'#### ' with nothing after it, an empty \\boxed{}, `x =`, `$ $`) made every completion of its prompt score `wrong`
(and an empty box `correct`), silently; it is now refused when the data loads, in one line naming the row, the column
and the setting that names it, and null stays the way to leave a row unscored (hypothesis draws the answers)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from grpo_engine.config import RewardsConfig
from grpo_engine.steps.rewards import NamedReward, RewardFunctionError, check_reward_columns, resolve_function

BLANK = ["", " ", "\t", "$ $", "\\text{}", "\\,", " \n "]
VALUES = ["42", "-3", "7.5", "\\frac{1}{2}", "x+1", "$12$", "1,234"]
# How datasets write an answer: the value itself, GSM8K's worked solution, MATH's boxed solution, an equation.
FORMS = ["{}", "#### {}", "She has 3 apples.\n#### {}", "\\boxed{{{}}}", "The answer is $\\boxed{{{}}}$.", "x = {}"]
ANSWER = st.tuples(st.sampled_from(FORMS), st.one_of(st.sampled_from(BLANK), st.sampled_from(VALUES)))


def _math_accuracy() -> NamedReward:
    return NamedReward("math_accuracy", resolve_function("math_accuracy", RewardsConfig(), 16), 1.0)


@settings(max_examples=150, deadline=None)
@given(answers=st.lists(st.one_of(ANSWER, st.none()), min_size=1, max_size=4))
def test_an_answer_math_accuracy_cannot_score_against_is_refused_naming_its_row(answers):
    rows = [{"prompt": "q", "answer": None if drawn is None else drawn[0].format(drawn[1])} for drawn in answers]
    unscorable = [i for i, drawn in enumerate(answers) if drawn is not None and drawn[1] in BLANK]
    reward = _math_accuracy()
    if not unscorable:
        check_reward_columns([reward], rows, "d.jsonl")
        scored = [(row, drawn[1]) for row, drawn in zip(rows, answers) if drawn is not None]
        assert reward.fn(["q"] * len(scored), [f"\\boxed{{{value}}}" for _, value in scored],
                         answer=[row["answer"] for row, _ in scored]) == [1.0] * len(scored)
        return
    with pytest.raises(RewardFunctionError) as refused:
        check_reward_columns([reward], rows, "d.jsonl")
    message = str(refused.value)
    assert "\n" not in message and f"row {unscorable[0]} column 'answer' (set by rewards.answer_column)" in message
    assert "holds no answer to score against" in message and "null" in message, message
