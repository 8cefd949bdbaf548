"""At the reward boundary (steps/reward_exits.py, reward_fence_process.py): what reward code raises that is not an
Exception, at import or at call, is one line naming the function or module (sys.exit(0) at import ended the run
with status 0 and no line; argparse at import printed a usage of `__main__.py`; its own KeyboardInterrupt read as
the user's Ctrl-C; CancelledError and the like were a traceback), while a real Ctrl-C stays the user's; the time
limit holds for the import; a forked child that returns into the engine is ended; a returned list is counted on
what it holds, not on what its __len__ says."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.config import RewardsConfig
from grpo_engine.steps.rewards import NamedReward, RewardFunctionError, load_reward_functions, score_completions
from processes import subprocess_env

DERANDOMIZE = bool(os.environ.get("CI"))
FIXTURES = [HealthCheck.function_scoped_fixture]
COUNTER = itertools.count()


class Abort(BaseException):
    """A user's own BaseException subclass."""


# what the user's code raises -> the words its line carries
EXITS = {
    "sys.exit(0)": "called sys.exit(0)",
    "sys.exit(2)": "called sys.exit(2)",
    "sys.exit('done')": "called sys.exit('done')",
    "sys.exit()": "called sys.exit(None)",
    "argparse.ArgumentParser().parse_args(['--no-such-flag'])": "argparse's parse_args() read the engine's command",
    "raise KeyboardInterrupt": "raised KeyboardInterrupt itself (no Ctrl-C came)",
    "raise asyncio.CancelledError()": "raised CancelledError, a BaseException that is not an Exception",
    "raise GeneratorExit('closed')": "raised GeneratorExit: closed, a BaseException that is not an Exception",
    "raise test_reward_boundary_properties.Abort('stop')": "raised Abort: stop, a BaseException that is not an",
}
PREAMBLE = "import argparse, asyncio, sys\nimport test_reward_boundary_properties\n"


def _module(tmp_path, statement: str, at_import: bool) -> str:
    name = f"boundary_case_{next(COUNTER)}"
    body = f"    {statement}\n" if not at_import else "    pass\n"
    (tmp_path / f"{name}.py").write_text(PREAMBLE + (f"{statement}\n" if at_import else "")
                                         + f"def score(prompts, completions, **kwargs):\n{body}"
                                         f"    return [1.0] * len(completions)\n")
    return name


@settings(max_examples=30, deadline=None, derandomize=DERANDOMIZE, suppress_health_check=FIXTURES)
@given(statement=st.sampled_from(sorted(EXITS)), at_import=st.booleans())
def test_what_reward_code_raises_that_is_not_an_exception_is_one_line_naming_it(statement, at_import, tmp_path,
                                                                                monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(os.path.dirname(__file__))
    monkeypatch.setattr(sys, "argv", ["grpo-engine", "train", "--run.max_steps", "1"])
    name = _module(tmp_path, statement, at_import)
    with pytest.raises(RewardFunctionError) as caught:
        rewards = load_reward_functions(RewardsConfig(functions=[f"{name}:score"]), 16)
        score_completions(rewards, ["p"] * 2, ["a"] * 2, {}, [[1]] * 2)
    message = str(caught.value)
    assert "\n" not in message and EXITS[statement] in message, message
    if at_import:  # the module's own line, not where a library (argparse) raised
        assert message.startswith(f"reward function '{name}:score': cannot import module '{name}': "
                                  f"{tmp_path / name}.py:3: "), message
    else:
        assert message.startswith("reward function 'score' "), message


def test_a_ctrl_c_during_a_reward_stays_the_users():
    """A KeyboardInterrupt a SIGINT caused is the person at the terminal: passed on, not called the function's."""
    import signal

    def score(prompts, completions, **kwargs):
        signal.raise_signal(signal.SIGINT)  # Python's handler raises KeyboardInterrupt here, as at a real Ctrl-C
        return [1.0] * len(completions)

    with pytest.raises(KeyboardInterrupt):
        score_completions([NamedReward("score", score, 1.0)], ["p"], ["c"], {}, [[1]])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


WAITS = {
    "sleep": "import time\ntime.sleep(3600)",
    "event": "import threading\nthreading.Event().wait()",
    "lock": "import threading\nlock = threading.Lock(); lock.acquire(); lock.acquire()",
    "socket": "import socket\na, b = socket.socketpair(); a.recv(1)",
}


@settings(max_examples=4, deadline=None, derandomize=DERANDOMIZE, suppress_health_check=FIXTURES)
@given(way=st.sampled_from(sorted(WAITS)), limit=st.floats(0.2, 0.6))
def test_a_reward_module_that_never_finishes_importing_stops_within_the_time_limit(way, limit, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"slow_import_{next(COUNTER)}"
    (tmp_path / f"{name}.py").write_text(WAITS[way] + "\ndef score(prompts, completions, **kw):\n    return []\n")
    start = time.monotonic()
    with pytest.raises(RewardFunctionError) as caught:
        load_reward_functions(RewardsConfig(functions=[f"{name}:score"], timeout_seconds=limit), 16)
    assert time.monotonic() - start < limit + 5
    assert str(caught.value) == (f"reward function '{name}:score': module '{name}' did not finish importing within "
                                 f"{limit:g} s (rewards.timeout_seconds; null for no limit)")


@settings(max_examples=30, deadline=None, derandomize=DERANDOMIZE)
@given(held=st.integers(0, 5), said=st.integers(0, 5), kind=st.sampled_from([list, tuple]))
def test_a_returned_sequence_is_counted_on_what_it_holds(held, said, kind):
    """A list subclass whose __len__ disagrees with its items: before, a shorter one left completions silently
    unscored (NaN), read as "not scored"."""
    class Lying(kind):
        def __len__(self):
            return said

    def score(prompts, completions, **kwargs):
        return Lying([1.0] * held)

    n = 3
    if held == n:
        assert score_completions([NamedReward("score", score, 1.0)], ["p"] * n, ["c"] * n, {}, [[1]] * n
                                 ).tolist() == [[1.0]] * n
        return
    with pytest.raises(RewardFunctionError, match=rf"^reward function 'score' must return a list of {n} floats "
                                                  rf"\(one per completion\), got {held} values$"):
        score_completions([NamedReward("score", score, 1.0)], ["p"] * n, ["c"] * n, {}, [[1]] * n)


FORKS = """
import os, sys
from grpo_engine.steps.rewards import NamedReward, score_completions
START = os.getpid()
def score(prompts, completions, **kwargs):
    if os.fork() == 0:
        return [0.0] * len(completions)  # the child returns into the engine, which would go on training
    os.wait()
    return [1.0] * len(completions)
table = score_completions([NamedReward('score', score, 1.0)], ['p'], ['c'], {}, [[1]])
print('went on in', 'parent' if os.getpid() == START else 'child', table.tolist())
"""


def test_a_forked_child_that_returns_into_the_engine_ends_there():
    done = subprocess.run([sys.executable, "-c", FORKS], capture_output=True, text=True, timeout=120,
                          env=subprocess_env())
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["went on in parent [[1.0]]"], done.stdout
    ended = [line for line in done.stderr.splitlines() if line.startswith("grpo-engine: process ")]
    assert len(ended) == 1 and "forked by a reward function, returned from it into the engine; it was ended" \
        in ended[0], done.stderr[-2000:]


def test_sys_exit_at_a_reward_modules_import_fails_the_run_in_one_line(tmp_path):
    """End to end: before, `grpo-engine train` ended with status 0, having trained nothing, and said not a word."""
    (tmp_path / "script_rewards.py").write_text(
        "import sys\ndef score(prompts, completions, **kw):\n    return [1.0] * len(completions)\nsys.exit(0)\n")
    args = [sys.executable, "-m", "grpo_engine", "train", "--output-dir", str(tmp_path / "run"), "--run.max_steps",
            "1", "--rewards.functions", "[script_rewards:score]"]
    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"grpo-engine train: RewardFunctionError: reward function 'script_rewards:score': cannot import module "
        f"'script_rewards': {tmp_path / 'script_rewards.py'}:4: called sys.exit(0): reward code may not end the run")

