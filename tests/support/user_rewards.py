"""Reward functions loaded by tests through the `module:function` syntax."""


def digit_count(prompts, completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


def raises(prompts, completions, **kwargs):
    raise ZeroDivisionError("boom")


def wrong_length(prompts, completions, **kwargs):
    return [1.0]


def none_for_odd(prompts, completions, **kwargs):
    return [None if i % 2 else 1.0 for i in range(len(completions))]


# Raises on the call number in the CRASH_AT_CALL environment variable: a run interrupted mid-training.
calls = {"count": 0}


def crash_at_call(prompts, completions, **kwargs):
    import os

    calls["count"] += 1
    if str(calls["count"]) == os.environ.get("CRASH_AT_CALL"):
        import signal
        import time

        # Ctrl-C twice in the middle of a step, as a person stops a run at once: the first asks for a stop at the
        # step's end, the second raises KeyboardInterrupt in the handler (one the code raised itself is its error)
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the handler raises at the next bytecode; the sleep is not reached in practice
        raise AssertionError("SIGINT was not delivered")
    return [0.0] * len(completions)


def reward_short_digits(completions, **kwargs):
    # The name of tests/grpo_kernels/integrations' TRL reward, so both trainers log rewards/reward_short_digits/*.
    return [float(sum(ch.isdigit() for ch in text)) - 0.1 * len(text) for text in completions]


def always_none(prompts, completions, **kwargs):
    return [None] * len(completions)


def numpy_and_bools(prompts, completions, **kwargs):
    import numpy as np

    values = [np.float32(0.5), np.int64(2), True, np.bool_(False), float("nan"), None]
    return np.array([values[i % len(values)] for i in range(len(completions))], dtype=object)


def raises_inside_helper(prompts, completions, **kwargs):
    return [_score_one(c) for c in completions]


def _score_one(completion):
    return {"known": 1.0}[completion]  # KeyError: the user's own bug


def by_difficulty(prompts, completions, difficulty, scale=1.0, **kwargs):
    # Reads the `difficulty` column: a parameter without a default (`scale` has one: not a column).
    return [scale * float(d) for d in difficulty]


def matches_solution(prompts, completions, **kwargs):
    return [float(c == s) for c, s in zip(completions, kwargs["solution"])]


matches_solution.dataset_columns = ("solution",)  # what @grpo_engine.steps.rewards.dataset_columns("solution") sets


def always_nan(prompts, completions, **kwargs):
    return [float("nan")] * len(completions)


def text_for_seven(prompts, completions, **kwargs):
    """A score for every completion but those of the prompt "7+7=", which get text: a row the message must name."""
    return ["bad" if prompt.startswith("7+7=") else 0.5 for prompt in prompts]
