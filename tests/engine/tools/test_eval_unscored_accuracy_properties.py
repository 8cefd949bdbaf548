"""Evaluation accuracy and pass@k count only the completions the first reward function scored: one it gives no
score (None: a row without an answer) is neither solved nor unsolved, and when it scored none the metric is null
(NaN), in `eval` and in training's evaluations alike (hypothesis draws each completion's verdict). Before, an
unscored completion counted as unsolved: evaluation data without answers read as accuracy 0.0, a value."""

from __future__ import annotations

import math

from hypothesis import given, settings, strategies as st

from grpo_engine.state.run_summary import summary_lines
from grpo_engine.config import load_config
from grpo_engine.steps.rewards import NamedReward
from grpo_engine.tools.evaluate import evaluate_prompts

SCORES = {"s": 1.0, "u": -1.0, "x": None}  # solved, unsolved, not scored


class _Batch:
    def __init__(self, completions: list[str]) -> None:
        self.completions = completions

    def token_ids_lists(self) -> list[list[int]]:
        return [[1] * (len(text) + 1) for text in self.completions]


class CountingBackend:
    """Answers the i-th request of a prompt with the text 'i': the reward reads the verdict the row plans for it."""

    def __init__(self) -> None:
        self.asked: dict[str, int] = {}

    def generate(self, prompts: list[str], greedy: bool = False, record_kept: bool = False) -> _Batch:
        texts = []
        for prompt in prompts:
            texts.append(str(self.asked.get(prompt, 0)))
            self.asked[prompt] = self.asked.get(prompt, 0) + 1
        return _Batch(texts)


def planned(prompts, completions, plan, **kwargs):
    return [SCORES[row_plan[int(text)]] for row_plan, text in zip(plan, completions)]


def _pass_at_k(n: int, c: int, k: int) -> float:
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


@settings(max_examples=80, deadline=None)
@given(samples=st.integers(1, 5), data=st.data())
def test_accuracy_and_pass_at_k_are_over_the_scored_completions(samples, data):
    plans = data.draw(st.lists(st.text("sux", min_size=samples, max_size=samples), min_size=1, max_size=5))
    rows = [{"prompt": f"p{i}", "plan": plan} for i, plan in enumerate(plans)]
    metrics = evaluate_prompts(CountingBackend(), rows, [row["prompt"] for row in rows],
                               [NamedReward("planned", planned, 1.0)], num_samples=samples, greedy=samples == 1,
                               batch_size=data.draw(st.integers(1, 8)))
    judged = sum(plan.count("s") + plan.count("u") for plan in plans)
    solved = sum(plan.count("s") for plan in plans)
    if judged == 0:
        assert math.isnan(metrics["accuracy"]), metrics
    else:
        assert math.isclose(metrics["accuracy"], solved / judged), (plans, metrics)
    for key in (key for key in metrics if key.startswith("pass@")):
        k = int(key.removeprefix("pass@"))
        counted = [_pass_at_k(len(p) - p.count("x"), p.count("s"), k) for p in plans if len(p) - p.count("x") >= k]
        expected = sum(counted) / len(counted) if counted else math.nan
        assert (math.isnan(metrics[key]) and math.isnan(expected)) or math.isclose(metrics[key], expected), \
            (key, plans, metrics)


def test_the_run_summary_says_an_accuracy_of_nothing_scored():
    config = load_config()
    for value in (math.nan, None):  # a run's own, and one read back from metrics.jsonl (null)
        lines = summary_lines([], {"accuracy": value}, {"accuracy": value, "num_prompts": 3}, config)
        assert lines == ["accuracy on the 3 evaluation prompts (greedy): null (the first reward function scored no "
                         "completion) -> null (the first reward function scored no completion)"], lines
