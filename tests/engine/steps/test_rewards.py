import math
import sys

import pytest

from grpo_engine.config import RewardsConfig
from grpo_engine.steps.rewards import (
    RewardFunctionError,
    answers_match,
    check_reward_columns,
    columns_read,
    dataset_columns,
    extract_boxed,
    format_reward,
    load_reward_functions,
    make_length_reward,
    make_math_accuracy,
    normalize_answer,
    reference_answer,
    score_completions,
)
from repo_paths import SUPPORT


def test_extract_boxed_takes_the_last_balanced_box():
    assert extract_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}} end") == "\\frac{1}{2}"
    assert extract_boxed("\\boxed {42}") == "42"
    assert extract_boxed("no box") is None
    assert extract_boxed("\\boxed{unclosed") is None
    assert extract_boxed("\\boxed{6}}") is None  # a stray closing brace: malformed
    assert extract_boxed("\\boxed{5} then \\boxed{6") is None  # a malformed last box: no earlier one stands in


@pytest.mark.parametrize("predicted, gold", [
    ("1,234", "1234"), ("$5$", "5"), ("5.", "5"), ("0.5", "\\frac{1}{2}"), ("\\dfrac{3}{4}", "0.75"),
    ("\\text{7}", "7"), ("10\\%", "10"), ("2/4", "0.5"),
])
def test_equivalent_answers_match(predicted, gold):
    assert answers_match(predicted, gold)


def test_different_answers_do_not_match():
    assert not answers_match("5", "6")
    assert not answers_match("x+1", "x+2")
    assert normalize_answer(" \\left( 1, 2 \\right) ") == "(1,2)"


def test_reference_answer_formats():
    assert reference_answer("She has 3 + 4 = 7 apples.\n#### 7") == "7"
    assert reference_answer("so \\boxed{12}") == "12"
    assert reference_answer(15) == "15"
    assert reference_answer(None) is None


def test_math_accuracy_scores_correct_wrong_missing():
    fn = make_math_accuracy(1.0, -1.0, -0.5, "answer")
    completions = ["\\boxed{7}", "\\boxed{8}", "seven", "\\boxed{7}"]
    scores = fn(prompts=[""] * 4, completions=completions, answer=["#### 7", "7", "7", None])
    assert scores == [1.0, -1.0, -0.5, None]


def test_math_accuracy_names_a_missing_answer_column():
    fn = make_math_accuracy(1.0, -1.0, -0.5, "solution")
    with pytest.raises(KeyError, match="'solution'"):
        fn(prompts=["p"], completions=["c"], answer=["1"])


def test_format_and_length():
    good = "<think>a\nb</think>\n<answer>3</answer>"
    assert format_reward([], [good, "<answer>3</answer>", good + " extra"]) == [1.0, 0.0, 0.0]
    length = make_length_reward(max_new_tokens=10, cache=4)
    assert length([], ["", "", "", ""], completion_ids=[[0] * 6, [0] * 8, [0] * 10, [0] * 3]) == [0.0, -0.5, -1.0, 0.0]


def test_module_function_rewards_and_weights(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(SUPPORT))
    config = RewardsConfig(functions=["user_rewards:digit_count", "format"], weights=[2.0, 1.0])
    rewards = load_reward_functions(config, 16)
    assert [(r.name, r.weight) for r in rewards] == [("digit_count", 2.0), ("format", 1.0)]
    table = score_completions(rewards, ["p", "p"], ["12", "a"], {}, [[1], [2]])
    assert table.tolist() == [[2.0, 0.0], [0.0, 0.0]]


@pytest.mark.parametrize("spec, message", [
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("user_rewards:missing", "has no callable 'missing'"),
])
def test_bad_reward_specs(spec, message, monkeypatch):
    monkeypatch.syspath_prepend(str(SUPPORT))
    with pytest.raises(RewardFunctionError, match=message):
        load_reward_functions(RewardsConfig(functions=[spec]), 16)


@pytest.mark.parametrize("fn, message", [
    ("raises", "'raises' raised ZeroDivisionError: boom"),
    ("wrong_length", "must return a list of 2 floats .* got 1 values"),
])
def test_misbehaving_reward_functions_are_named(fn, message, monkeypatch):
    monkeypatch.syspath_prepend(str(SUPPORT))
    rewards = load_reward_functions(RewardsConfig(functions=[f"user_rewards:{fn}"]), 16)
    with pytest.raises(RewardFunctionError, match=message):
        score_completions(rewards, ["p", "q"], ["a", "b"], {}, [[1], [2]])


def test_none_becomes_nan(monkeypatch):
    monkeypatch.syspath_prepend(str(SUPPORT))
    rewards = load_reward_functions(RewardsConfig(functions=["user_rewards:none_for_odd"]), 16)
    table = score_completions(rewards, ["p"] * 3, ["a", "b", "c"], {}, [[1]] * 3)
    assert table[0, 0] == 1.0 and math.isnan(table[1, 0]) and table[2, 0] == 1.0


MATH_CASES = [  # (completion, gold, score): the answer is scored, not the question restated, nor a malformed box
    ("\\boxed{5}", "5", 1.0), ("2+3=\\boxed{5}", "5", 1.0), ("\\boxed{2+3=5}", "5", 1.0), ("\\boxed{x = 5}", "5", 1.0),
    ("\\boxed{2+3}", "5", -1.0), ("\\boxed{4 \\times 2}", "8", -1.0), ("\\boxed{10-4}", "6", -1.0),
    ("\\boxed{\\frac{1}{2}+\\frac{1}{2}}", "1", -1.0), ("\\boxed{\\sqrt{4}}", "2", -1.0),
    ("\\boxed{6}}", "6", -0.5), ("}\\boxed{6}", "6", -0.5), ("\\boxed{6", "6", -0.5), ("\\boxed{5} \\boxed{6", "5", -0.5),
    ("\\boxed 6", "6", -0.5), ("\\boxed{-3}", "-3", 1.0), ("\\boxed{3/4}", "0.75", 1.0), ("\\boxed{\\frac{3}{4}}", "3/4", 1.0),
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}", 1.0), ("\\boxed{x+1}", "x+1", 1.0), ("\\boxed{x=5}", "x = 5", 1.0),
]


def _math_scores():
    fn = make_math_accuracy(1.0, -1.0, -0.5, "answer")
    return fn(prompts=[""] * len(MATH_CASES), completions=[c for c, _, _ in MATH_CASES],
              answer=[g for _, g, _ in MATH_CASES])


def test_math_accuracy_scores_the_answer_not_the_question_nor_a_malformed_box():
    assert _math_scores() == [score for _, _, score in MATH_CASES]


def test_math_accuracy_scores_the_same_with_and_without_math_verify(monkeypatch):
    pytest.importorskip("math_verify")  # installed: its presence must change nothing
    with_package = _math_scores()
    monkeypatch.setitem(sys.modules, "math_verify", None)  # `import math_verify` now raises ImportError
    with pytest.raises(ImportError):
        import math_verify  # noqa: F401
    assert _math_scores() == with_package == [score for _, _, score in MATH_CASES]


def test_numpy_values_and_bools_are_accepted_as_trl_does(monkeypatch):
    monkeypatch.syspath_prepend(str(SUPPORT))
    rewards = load_reward_functions(RewardsConfig(functions=["user_rewards:numpy_and_bools"]), 16)
    table = score_completions(rewards, ["p"] * 6, ["c"] * 6, {}, [[1]] * 6)
    assert table[:4, 0].tolist() == [0.5, 2.0, 1.0, 0.0]
    assert math.isnan(table[4, 0]) and math.isnan(table[5, 0])  # NaN and None: not scored


def test_a_reward_that_raises_keeps_its_own_traceback(monkeypatch):
    monkeypatch.syspath_prepend(str(SUPPORT))
    rewards = load_reward_functions(RewardsConfig(functions=["user_rewards:raises_inside_helper"]), 16)
    with pytest.raises(RewardFunctionError) as exc:
        score_completions(rewards, ["p"], ["unknown"], {}, [[1]])
    assert "in _score_one" in exc.value.user_traceback and "score_completions" not in exc.value.user_traceback


def test_module_rewards_resolve_from_the_current_directory(monkeypatch, tmp_path):
    import sys

    (tmp_path / "my_local_reward.py").write_text("def score(prompts, completions, **kw):\n"
                                                 "    return [1.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    # As under the `grpo-engine` console script: neither '' nor the current directory is on sys.path.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    (reward,) = load_reward_functions(RewardsConfig(functions=["my_local_reward:score"]), 16)
    assert reward.fn([], ["a", "b"]) == [1.0, 1.0]


def test_an_infinite_reward_is_rejected(monkeypatch):
    rewards = load_reward_functions(RewardsConfig(functions=["format"]), 16)
    rewards[0].fn = lambda **kw: [float("inf")]
    with pytest.raises(RewardFunctionError, match="returned inf for completion 0; expected a finite number"):
        score_completions(rewards, ["p"], ["c"], {}, [[1]])


def test_reward_functions_declare_the_columns_they_read(monkeypatch):
    monkeypatch.syspath_prepend(str(SUPPORT))
    config = RewardsConfig(functions=["math_accuracy", "format", "length", "user_rewards:by_difficulty",
                                      "user_rewards:matches_solution", "user_rewards:digit_count"],
                           answer_column="gold")
    rewards = load_reward_functions(config, 16)
    # built-ins; a parameter without a default; a declaration; only **kwargs: nothing known
    assert [r.columns for r in rewards] == [("gold",), (), (), ("difficulty",), ("solution",), ()]

    @dataset_columns("a", "b")
    def declared(prompts, completions, c, **kwargs):  # the declaration wins over the signature
        return [0.0] * len(completions)

    assert columns_read(declared) == ("a", "b")


@pytest.mark.parametrize("rows, spec, message", [
    ([{"prompt": "p", "question": "q"}], "math_accuracy",
     "dataset 'd.jsonl' has no 'answer' column, which reward function 'math_accuracy' reads (set by "
     "rewards.answer_column); columns: ['prompt', 'question']"),
    ([{"prompt": "p", "difficulty": 1}, {"prompt": "q"}], "user_rewards:by_difficulty",
     "dataset 'd.jsonl' row 1 has no 'difficulty' column, which reward function 'by_difficulty' reads; "
     "columns: ['prompt']"),
])
def test_data_without_a_column_a_reward_reads_is_named(rows, spec, message, monkeypatch):
    monkeypatch.syspath_prepend(str(SUPPORT))
    rewards = load_reward_functions(RewardsConfig(functions=[spec]), 16)
    with pytest.raises(RewardFunctionError) as exc:
        check_reward_columns(rewards, rows, "d.jsonl")
    assert str(exc.value) == message
    check_reward_columns(rewards, [{**row, "answer": None, "difficulty": None} for row in rows], "d.jsonl")  # null: ok
