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
        raise KeyboardInterrupt("simulated interruption")
    return [0.0] * len(completions)
