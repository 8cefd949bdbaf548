"""A reward function's signature is checked against the call the engine makes, fn(prompts=, completions=,
completion_ids=, **every other column), when the data loads: a signature that cannot take it is one line naming the
function, before any model loads, and one that passes is called without a binding error (hypothesis draws the
parameter lists and the data's columns). Before, `def f():` or `def f(prompts, completions, answer)` over data
with a `question` column loaded the model and failed at step 1."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from grpo_engine.steps.rewards import NamedReward, RewardFunctionError, check_reward_columns, score_completions

NAMES = ["prompts", "completions", "completion_ids", "answer", "question"]


@st.composite
def signatures(draw):
    """The source of a reward function with a drawn parameter list."""
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=4))
    defaults = draw(st.integers(0, len(names)))
    parts = [n if i < len(names) - defaults else f"{n}=None" for i, n in enumerate(names)]
    if draw(st.booleans()):
        parts.append("*args")
    keyword_only = draw(st.sampled_from([None, "answer", "difficulty"]))
    if keyword_only and keyword_only not in names:
        parts.append(("" if "*args" in parts else "*, ") + f"{keyword_only}" + draw(st.sampled_from(["", "=1"])))
    if draw(st.booleans()):
        parts.append("**kwargs")
    return f"def reward({', '.join(parts)}):\n    return [0.0] * 2\n"


@settings(max_examples=150, deadline=None)
@given(source=signatures(), columns=st.lists(st.sampled_from(["answer", "question"]), unique=True))
def test_a_reward_is_refused_when_the_data_loads_exactly_when_the_engines_call_would_not_bind(source, columns):
    namespace: dict = {}
    exec(source, namespace)
    reward = NamedReward("reward", namespace["reward"], 1.0)
    rows = [{"prompt": "1+1=", **{c: "2" for c in columns}}] * 2
    try:
        check_reward_columns([reward], rows, "d.jsonl", "prompt")
    except RewardFunctionError as exc:
        message = str(exc)
        assert "\n" not in message and "'reward'" in message and len(message) < 400, message
        try:  # the call it refused would indeed have failed
            score_completions([reward], ["p"] * 2, ["c"] * 2, {c: ["2"] * 2 for c in columns}, [[1], [2]])
        except RewardFunctionError as call:
            assert "raised TypeError" in str(call)
        else:  # refused only for a column the function reads that the data lacks
            assert "column" in message and "cannot take the call" not in message, (source, message)
        return
    score_completions([reward], ["p"] * 2, ["c"] * 2, {c: ["2"] * 2 for c in columns}, [[1], [2]])


@settings(max_examples=30, deadline=None)
@given(prompt_column=st.sampled_from(["prompt", "question", "answer"]), answer_column=st.sampled_from(["answer",
                                                                                                        "question"]))
def test_a_reward_that_reads_the_prompt_column_is_refused_when_the_data_loads(prompt_column, answer_column):
    from grpo_engine.config import RewardsConfig
    from grpo_engine.steps.rewards import make_math_accuracy

    c = RewardsConfig()
    reward = NamedReward("math_accuracy", make_math_accuracy(c.math_correct, c.math_wrong, c.math_no_answer,
                                                             answer_column), 1.0)
    rows = [{"prompt": "1+1=", "question": "1+1=", "answer": "2"}]
    if prompt_column != answer_column:
        check_reward_columns([reward], rows, "d.jsonl", prompt_column)
        return
    try:
        check_reward_columns([reward], rows, "d.jsonl", prompt_column)
    except RewardFunctionError as exc:
        assert "data.prompt_column" in str(exc) and "\n" not in str(exc)
    else:
        raise AssertionError("a reward reading the prompt column, which it never receives, was accepted")
