"""A reward function cannot change what the engine relies on: its arguments, the RNGs, the process's state."""

import builtins
import gc
import locale
import logging
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest
import torch

from grpo_engine.config import RewardsConfig
from grpo_engine.data.prompts import reward_columns
from grpo_engine.state.metrics import merge_metrics
from grpo_engine.steps.rewards import RewardFunctionError, load_reward_functions, reward_names, score_completions
from repo_paths import SUPPORT

MEDDLERS = ["changes_directory", "sets_environment", "installs_signal_handlers", "draws_and_seeds_random_numbers",
            "flips_torch_switches", "replaces_streams_and_filters", "meddles_and_raises"]


def process_state() -> dict:
    """Everything docs/engine.md says a reward function cannot change, read back."""
    umask = os.umask(0)
    os.umask(umask)
    return {
        "cwd": os.getcwd(), "environ": dict(os.environ), "umask": umask,
        "signals": {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)},
        "timers": [signal.getitimer(which)[0] > 0 for which in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL,
                                                                 signal.ITIMER_PROF)],
        "python_rng": random.getstate(), "numpy_rng": repr(np.random.get_state()),
        "torch_rng": torch.get_rng_state().tolist(), "dtype": torch.get_default_dtype(),
        "grad": torch.is_grad_enabled(), "threads": torch.get_num_threads(),
        "deterministic": (torch.are_deterministic_algorithms_enabled(),
                          torch.is_deterministic_algorithms_warn_only_enabled()),
        "anomaly": torch.is_anomaly_enabled(), "matmul": torch.get_float32_matmul_precision(),
        "streams": (sys.stdout, sys.stderr, sys.stdin), "filters": list(warnings.filters),
        "logging": logging.root.manager.disable, "recursion": sys.getrecursionlimit(),
        "flush_denormal": float(torch.tensor(1e-39) * 1.0) == 0.0, "numpy_errors": np.geterr(),
        "gc": gc.isenabled(), "trace": sys.gettrace(), "profile": sys.getprofile(),
        "switch_interval": sys.getswitchinterval(), "int_digits": sys.get_int_max_str_digits(),
        "excepthooks": (sys.excepthook, threading.excepthook),
        "module_hooks": {name: dict(value) if isinstance(value, dict) else value
                         for name, value in vars(torch.nn.modules.module).items() if name.startswith("_global_")},
        "autocast": [(torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)) for device in ("cpu", "cuda")]
        + [torch.is_autocast_cache_enabled()],
        **operating_system_state(),
    }


def operating_system_state() -> dict:
    """What the fence also puts back (reward_fence_process.py and the later interpreter switches), read back."""
    stack = threading.stack_size()
    threading.stack_size(stack)  # reading it sets it to 0
    return {
        "limits": {name: resource.getrlimit(getattr(resource, name)) for name in ("RLIMIT_NOFILE", "RLIMIT_AS")},
        "signal_mask": signal.pthread_sigmask(signal.SIG_BLOCK, []),
        "descriptors": [(os.fstat(fd).st_dev, os.fstat(fd).st_ino) for fd in (0, 1, 2)],
        "functions": (os.chdir, os.remove, shutil.rmtree, subprocess.Popen, time.time, builtins.exit),
        "json_module": sys.modules.get("json"),
        "loggers": [(logger.level, list(logger.handlers), logger.propagate, logger.disabled)
                    for logger in (logging.getLogger(), logging.getLogger("grpo_engine"))],
        "socket_timeout": socket.getdefaulttimeout(), "gc_thresholds": gc.get_threshold(),
        "unraisablehook": sys.unraisablehook, "stack_size": stack, "locale": locale.setlocale(locale.LC_ALL),
    }


def score_with(spec: str, columns: dict, n: int = 2):
    rewards = load_reward_functions(RewardsConfig(functions=[spec]), 16)
    return score_completions(rewards, ["p"] * n, ["a"] * n, columns, [[1]] * n)


@pytest.mark.parametrize("name", MEDDLERS)
def test_a_reward_function_leaves_the_process_as_it_found_it(name, monkeypatch):
    monkeypatch.syspath_prepend(str(SUPPORT))
    before = process_state()
    try:
        score_with(f"meddling_rewards:{name}", {})
    except RewardFunctionError as exc:
        assert name == "meddles_and_raises" and "after meddling" in str(exc)
    after = process_state()
    assert {key for key in before if before[key] != after[key]} == set()


def test_a_reward_that_draws_random_numbers_leaves_the_training_stream_alone(monkeypatch):
    monkeypatch.syspath_prepend(str(SUPPORT))
    torch.manual_seed(7)
    expected = torch.rand(4)
    torch.manual_seed(7)
    score_with("meddling_rewards:draws_and_seeds_random_numbers", {})
    assert torch.equal(torch.rand(4), expected)


def test_a_reward_that_changes_its_arguments_changes_no_row(monkeypatch):
    monkeypatch.syspath_prepend(str(SUPPORT))
    rows = [{"prompt": "p", "tags": ["a"]}, {"prompt": "q", "tags": []}]
    rewards = load_reward_functions(RewardsConfig(functions=["meddling_rewards:appends_to_columns"] * 2), 16)
    prompts, completions, ids = ["p", "q"], ["x", "y"], [[1], [2]]
    for _ in range(3):  # later steps (and both functions of one step) see the rows as loaded
        table = score_completions(rewards, prompts, completions, reward_columns(rows, "prompt"), ids)
        assert table.tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert rows == [{"prompt": "p", "tags": ["a"]}, {"prompt": "q", "tags": []}]
    assert (prompts, completions, ids) == (["p", "q"], ["x", "y"], [[1], [2]])


def test_reward_metric_names_never_coincide():
    assert reward_names(["a:score", "b:score", "format"]) == ["a:score", "b:score", "format"]
    assert reward_names(["format", "format", "x:format"]) == ["format#1", "format#2", "x:format"]
    assert reward_names(["math_accuracy", "m:math_accuracy"]) == ["math_accuracy", "m:math_accuracy"]


def test_two_phases_reporting_one_metric_is_refused():
    assert merge_metrics({"a": 1}, {"b": 2}) == {"a": 1, "b": 2}
    with pytest.raises(RuntimeError, match="metric 'reward'"):
        merge_metrics({"reward": 1.0}, {"loss": 0.0, "reward": 2.0})


@pytest.mark.parametrize("source, line, error", [
    ("x = 1\ndef f(prompts completions):\n    return []\n", 2, "SyntaxError"),
    ("import math\n\nVALUE = 1 / 0\n", 3, "ZeroDivisionError: division by zero"),
    ("import no_such_dependency_xyz\n", 1, "ModuleNotFoundError: No module named 'no_such_dependency_xyz'"),
])
def test_a_reward_module_that_fails_to_import_is_one_line_naming_file_and_line(source, line, error, tmp_path,
                                                                               monkeypatch):
    (tmp_path / "broken_reward_module.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "broken_reward_module", raising=False)
    with pytest.raises(RewardFunctionError) as caught:
        load_reward_functions(RewardsConfig(functions=["broken_reward_module:f"]), 16)
    message = str(caught.value)
    assert "\n" not in message
    assert f"{tmp_path / 'broken_reward_module.py'}:{line}: {error}" in message
    assert caught.value.user_traceback is None
