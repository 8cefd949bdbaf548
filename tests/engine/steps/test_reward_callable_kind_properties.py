"""Property test of the KIND of callable a reward spec `module:name` names: a function, a lambda, a functools.partial,
a callable object, a bound method and a C function load, and the run's fingerprint of the reward code names the
file that defines each (none for a C function); a class, a generator function, an async function or an async
generator (a partial of one too), whose call returns no list of scores, is refused when the rewards load, before any
rollout, by one line naming the spec. Before, a partial or a callable object failed setup with inspect's TypeError
traceback, and the others were refused only after a whole rollout, by what their call returned."""

from __future__ import annotations

import itertools
import os
import textwrap

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_engine.config import RewardsConfig
from grpo_engine.steps.rewards import RewardFunctionError, code_fingerprint, load_reward_functions

DERANDOMIZE = bool(os.environ.get("CI"))
# kind -> (its definition in the module, as `reward = ...`, whether calling it returns the scores)
KINDS = {
    "function": ("def reward(completions, **kw):\n    return [1.0] * len(completions)", True),
    "lambda": ("reward = lambda completions, **kw: [1.0] * len(completions)", True),
    "partial of a function": ("import functools\ndef _score(completions, bonus, **kw):\n"
                              "    return [bonus] * len(completions)\nreward = functools.partial(_score, bonus=1.0)",
                              True),
    "callable object": ("class _Scorer:\n    def __call__(self, completions, **kw):\n"
                        "        return [1.0] * len(completions)\nreward = _Scorer()", True),
    "bound method": ("class _Scorer:\n    def score(self, completions, **kw):\n"
                     "        return [1.0] * len(completions)\nreward = _Scorer().score", True),
    "C function": ("from math import fsum as reward", True),
    "class": ("class reward:\n    def __init__(self, completions, **kw):\n        self.n = len(completions)", False),
    "generator function": ("def reward(completions, **kw):\n    for _ in completions:\n        yield 1.0", False),
    "async function": ("async def reward(completions, **kw):\n    return [1.0] * len(completions)", False),
    "async generator": ("async def reward(completions, **kw):\n    for _ in completions:\n        yield 1.0", False),
    "partial of an async function": ("import functools\nasync def _score(completions, bonus, **kw):\n"
                                     "    return [bonus] * len(completions)\n"
                                     "reward = functools.partial(_score, bonus=1.0)", False),
    "partial of a generator function": ("import functools\ndef _score(completions, bonus, **kw):\n"
                                        "    yield bonus\nreward = functools.partial(_score, bonus=1.0)", False),
    "callable object with an async __call__": ("class _Scorer:\n    async def __call__(self, completions, **kw):\n"
                                               "        return [1.0]\nreward = _Scorer()", False),
}
_NAMES = itertools.count()


@settings(max_examples=60, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(sorted(KINDS)), builtin_too=st.booleans())
def test_a_reward_of_any_callable_kind_loads_or_is_refused_naming_it_before_any_rollout(kind, builtin_too, tmp_path,
                                                                                         monkeypatch):
    source, returns_scores = KINDS[kind]
    module = f"kind_reward_{next(_NAMES)}"  # a fresh module per example: nothing of the last one cached
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = f"{module}:reward"
    config = RewardsConfig(functions=["format", spec] if builtin_too else [spec])
    try:
        rewards = load_reward_functions(config, max_new_tokens=16)
        fingerprint = code_fingerprint(rewards)
    except RewardFunctionError as exc:
        message = str(exc)
        assert not returns_scores, f"refused a {kind}: {message}"
        assert "\n" not in message and spec in message, message
        return
    assert returns_scores, f"loaded a {kind}, whose call returns no list of scores"
    if kind == "C function":
        assert fingerprint is None  # no source of the user's to fingerprint
    else:
        assert fingerprint is not None and fingerprint["source"] == f"{module}.py", fingerprint
