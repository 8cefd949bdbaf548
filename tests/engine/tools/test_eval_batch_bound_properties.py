"""`grpo-engine eval --batch-size B` generates at most B completions at once, whatever --num-samples is: a prompt's
samples are split over batches too, and the metrics are those of the same completions generated in one batch.
Before, --num-samples past --batch-size generated every sample of a prompt in one batch (--num-samples 40
--batch-size 8: one batch of 40; on a real model --num-samples 1000 ran out of memory)."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings, strategies as st

from grpo_engine.config import RewardsConfig
from grpo_engine.steps.rewards import load_reward_functions
from grpo_engine.tools.evaluate import evaluate_prompts


class _Batch:
    def __init__(self, completions: list[str]) -> None:
        self.completions = completions
        width = max(len(text) for text in completions)
        self.completion_attention = torch.tensor([[1] * len(text) + [0] * (width - len(text)) for text in completions])

    def token_ids_lists(self) -> list[list[int]]:
        return [[ord(char) for char in text] for text in self.completions]


class RecordingBackend:
    """Answers each prompt with a text that depends on the prompt and how often it was asked (a sampler's variety),
    and records the size of every generate call."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.asked: dict[str, int] = {}

    def generate(self, prompts: list[str], greedy: bool = False, record_kept: bool = False) -> _Batch:
        self.sizes.append(len(prompts))
        texts = []
        for prompt in prompts:
            seen = self.asked[prompt] = self.asked.get(prompt, 0) + 1
            texts.append("7" * ((len(prompt) + seen) % 4) + "x")
        return _Batch(texts)


@settings(max_examples=60, deadline=None)
@given(prompts=st.integers(1, 12), num_samples=st.integers(1, 20), batch_size=st.integers(1, 20))
def test_no_generate_call_exceeds_the_batch_size_and_the_metrics_do_not_depend_on_it(prompts, num_samples,
                                                                                      batch_size):
    rows = [{"prompt": "p" * (i + 1)} for i in range(prompts)]
    texts = [row["prompt"] for row in rows]
    rewards = load_reward_functions(RewardsConfig(functions=["user_rewards:digit_count"]), 8)
    greedy = num_samples == 1
    bounded, whole = RecordingBackend(), RecordingBackend()
    metrics = evaluate_prompts(bounded, rows, texts, rewards, num_samples=num_samples, greedy=greedy,
                               batch_size=batch_size)
    reference = evaluate_prompts(whole, rows, texts, rewards, num_samples=num_samples, greedy=greedy,
                                 batch_size=prompts * num_samples)
    assert max(bounded.sizes) <= batch_size, bounded.sizes
    assert sum(bounded.sizes) == prompts * num_samples
    assert metrics.keys() == reference.keys()
    assert all(math.isclose(metrics[key], reference[key], rel_tol=1e-6, abs_tol=1e-9) for key in metrics), \
        (metrics, reference)
