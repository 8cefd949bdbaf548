"""math_accuracy reads a blank reference answer as no answer, as it reads null: '', whitespace, GSM8K's '####'
with nothing after it, an empty \\boxed{}, `x =` give no score to any completion (the row is left out of the reward,
and of evaluation accuracy), whatever the completion; a reference with a value still scores every completion.
Before, a blank one scored every completion wrong: evaluation data whose answers were empty read as accuracy 0.0."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from grpo_engine.config import RewardsConfig
from grpo_engine.steps.rewards import load_reward_functions

BLANK = st.text(" \t\n\u00a0\u3000", max_size=4)
BLANK_ANSWERS = st.one_of(BLANK, BLANK.map(lambda ws: f"work{ws}####{ws}"), BLANK.map(lambda ws: f"\\boxed{{{ws}}}"),
                          BLANK.map(lambda ws: f"x ={ws}"))
COMPLETIONS = st.lists(st.sampled_from(["\\boxed{}", "\\boxed{3}", "no box", "\\boxed{ }", ""]) | st.text(max_size=12),
                       min_size=1, max_size=4)


def _math_accuracy():
    return load_reward_functions(RewardsConfig(functions=["math_accuracy"]), 16)[0].fn


@settings(max_examples=80, deadline=None)
@given(answer=BLANK_ANSWERS, completions=COMPLETIONS)
def test_a_blank_reference_scores_no_completion(answer, completions):
    scores = _math_accuracy()([""] * len(completions), completions, answer=[answer] * len(completions))
    assert scores == [None] * len(completions), (answer, scores)


@settings(max_examples=40, deadline=None)
@given(value=st.integers(-999, 999), form=st.sampled_from(["{}", "#### {}", "\\boxed{{{}}}", "x = {}", " {} "]),
       completions=COMPLETIONS)
def test_a_reference_with_a_value_scores_every_completion(value, form, completions):
    answer = form.format(value)
    scores = _math_accuracy()([""] * len(completions), completions + [f"\\boxed{{{value}}}"],
                              answer=[answer] * (len(completions) + 1))
    assert None not in scores and scores[-1] == 1.0, (answer, scores)
