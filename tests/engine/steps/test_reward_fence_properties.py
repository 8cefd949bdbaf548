"""The fence around reward functions, over generated combinations of what user code can change, at import and at
each call: the process state is as before, and each change is said once in one line naming the function or module
(drawing random numbers is a reward's right: put back without a word). A non-daemon thread it leaves running is
named and recorded, and the CLI ends the process without waiting for it."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings, strategies as st

from grpo_engine.config import RewardsConfig
from grpo_engine.steps import reward_fence
from grpo_engine.steps.rewards import NamedReward, load_reward_functions, score_completions
from repo_paths import SUPPORT
from test_reward_fence import process_state

# torch sets an environment variable (its inductor cache directory) the first time deterministic algorithms are
# switched on: done here, outside the fence, so that a case switching them on changes only what it names.
torch.use_deterministic_algorithms(True)
torch.use_deterministic_algorithms(False)
RELEASE = threading.Event()  # lets the non-daemon threads the tests start end with the test

# what user code does -> (the statement, the words the warning carries; None: no warning)
MEDDLES = {
    "grad off": ("torch.set_grad_enabled(False)", "torch's grad mode (True -> False)"),
    "float64 default": ("torch.set_default_dtype(torch.float64)", "torch's default dtype"),
    "threads": ("torch.set_num_threads(torch.get_num_threads() + 1)", "torch's thread count"),
    "deterministic": ("torch.use_deterministic_algorithms(True)", "torch's deterministic-algorithms mode"),
    "matmul precision": ("torch.set_float32_matmul_precision('medium')", "torch's float32 matmul precision"),
    "chdir": ("os.chdir(tempfile.gettempdir())", "the working directory"),
    "set env": ("os.environ['GRPO_FENCE_TEST'] = '1'", "GRPO_FENCE_TEST"),  # one line names every variable
    "drop env": ("os.environ.pop('HOME', None)", "HOME"),
    "umask": ("os.umask(0o077)", "the umask"),
    "signal": ("signal.signal(signal.SIGUSR2, lambda *a: None)", "signal handlers"),
    # a timer whose signal comes later, mid-training (SIGALRM, SIGVTALRM, SIGPROF: each stopped the run as if sent)
    "alarm timer": ("signal.alarm(3600)", "ITIMER_REAL"),
    "cpu timer": ("signal.setitimer(signal.ITIMER_PROF, 3600, 3600)", "ITIMER_PROF"),
    "virtual timer": ("signal.setitimer(signal.ITIMER_VIRTUAL, 3600)", "ITIMER_VIRTUAL"),
    "recursion": ("sys.setrecursionlimit(sys.getrecursionlimit() + 7)", "the recursion limit"),
    "logging": ("logging.disable(logging.CRITICAL)", "logging's disable level"),
    "stdout": ("sys.stdout = io.StringIO()", "sys.stdout / sys.stderr / sys.stdin"),
    "flush denormals": ("torch.set_flush_denormal(True)", "torch's flush-denormal mode"),
    "numpy errors": ("numpy.seterr(all='raise')", "NumPy's floating-point error handling"),
    "gc off": ("gc.disable()", "the garbage collector's state"),
    "profile": ("sys.setprofile(lambda *a: None)", "the profile function"),
    "switch interval": ("sys.setswitchinterval(0.5)", "the thread switch interval"),
    "int digits": ("sys.set_int_max_str_digits(700)", "the integer string conversion limit"),
    "excepthook": ("sys.excepthook = lambda *a: None", "sys.excepthook"),
    "thread excepthook": ("threading.excepthook = lambda *a: None", "threading.excepthook"),
    # torch's process-wide numerics: a hook every module runs, autocast left on (the training forwards in bfloat16)
    "forward hook": ("torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: o * float('nan'))",
                     "torch's global module hooks"),
    "backward hook": ("torch.nn.modules.module.register_module_full_backward_hook(lambda m, gi, go: None)",
                      "torch's global module hooks"),
    "cpu autocast": ("torch.set_autocast_enabled('cpu', True)", "torch's cpu autocast (False -> True)"),
    "autocast dtype": ("torch.set_autocast_dtype('cpu', torch.float16)", "torch's cpu autocast dtype"),
    "autocast cache": ("torch.set_autocast_cache_enabled(False)", "torch's autocast cache flag"),
    # What the operating system keeps and the modules the engine calls (reward_fence_process.py), and the later
    # interpreter switches: each outlived the call before.
    "file limit": ("resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 1, "
                   "resource.getrlimit(resource.RLIMIT_NOFILE)[1]))", "the resource limit RLIMIT_NOFILE"),
    "signal mask": ("signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])", "the signal mask"),
    "quiet stderr": ("fd = os.open(os.devnull, os.O_WRONLY); os.dup2(fd, 2); os.close(fd)", "file descriptor 2"),
    "closed stdout": ("os.close(1)", "file descriptor 1"),
    "guard chdir": ("os.chdir = None", "functions of modules the engine calls"),  # human-eval's reliability_guard
    "guard rmtree": ("shutil.rmtree = None; subprocess.Popen = None; builtins.exit = None",
                     "functions of modules the engine calls"),
    "frozen clock": ("time.time = lambda: 0.0", "functions of modules the engine calls"),
    # any standard module, not a list of the known ones: the fence's own copy of the next call's arguments, its
    # resource limits, the engine's warnings and the CLI's exit; a thread hook left set where None was
    "guard deepcopy": ("copy.deepcopy = None", "functions of modules the engine calls"),
    "guard getrlimit": ("resource.getrlimit = None", "functions of modules the engine calls"),
    "guard warn exit": ("warnings.warn = None; sys.exit = None; pickle.dumps = None",
                        "functions of modules the engine calls"),
    "guard thread trace": ("threading.settrace(lambda *a: None)", "functions of modules the engine calls"),
    "blocked module": ("sys.modules['json'] = None", "modules in sys.modules (json)"),
    "root handler": ("logging.getLogger().addHandler(logging.StreamHandler(io.StringIO())); "  # basicConfig's doing
                     "logging.getLogger().setLevel(logging.ERROR)", "the root logger"),
    "engine logger": ("logging.getLogger('grpo_engine').setLevel(logging.CRITICAL)", "the 'grpo_engine' logger"),
    "socket timeout": ("socket.setdefaulttimeout(0.5)", "the default socket timeout"),
    "gc thresholds": ("gc.set_threshold(0)", "the garbage collector's thresholds"),
    "unraisablehook": ("sys.unraisablehook = lambda u: None", "sys.unraisablehook"),
    "stack size": ("threading.stack_size(1 << 20)", "the new threads' stack size"),
    "locale": ("locale.setlocale(locale.LC_ALL, 'C' if locale.setlocale(locale.LC_ALL) != 'C' else 'C.UTF-8')",
               "the C locale"),
    "random draws": ("random.random(); numpy.random.rand(); torch.rand(3); torch.manual_seed(5)", None),
    "daemon thread": ("threading.Thread(target=RELEASE.wait, daemon=True).start()", None),
    "non-daemon thread": ("threading.Thread(target=RELEASE.wait, name='scorer-loop').start()",
                          "left 1 thread running that is not a daemon ('scorer-loop')"),
}
PREAMBLE = ("import builtins, copy, gc, io, locale, logging, os, pickle, random, resource, shutil, signal, socket, "
            "subprocess, sys, tempfile, threading, time, warnings\nimport numpy, torch\n"
            "from test_reward_fence_properties import RELEASE\n")
COUNTER = itertools.count()


@pytest.fixture(autouse=True)
def _release_threads():
    yield
    RELEASE.set()
    reward_fence.LEFT_RUNNING.clear()


def _module(tmp_path, body: str, at_import: bool, on_call: int = 1) -> str:
    """A reward module doing `body` at import, or in its `on_call`-th call only (a change on a later call is put
    back and said as one on the first)."""
    name = f"fence_case_{next(COUNTER)}"
    call = "    pass\n" if at_import else f"    CALLS.append(1)\n    if len(CALLS) == {on_call}:\n" + \
        "".join(f"        {line}\n" for line in body.splitlines())
    module = PREAMBLE + "CALLS = []\n" + (body + "\n" if at_import else "") + \
        f"def score(prompts, completions, **kwargs):\n{call}    return [1.0] * len(completions)\n"
    (tmp_path / f"{name}.py").write_text(module)
    return name


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chosen=st.lists(st.sampled_from(sorted(MEDDLES)), min_size=1, max_size=5, unique=True),
       at_import=st.booleans(), on_call=st.sampled_from([1, 2, 3]))
# NaN forwards, bf16 training
@example(chosen=["forward hook", "backward hook", "cpu autocast"], at_import=False, on_call=1)
@example(chosen=["forward hook", "autocast dtype", "autocast cache"], at_import=True, on_call=1)
@example(chosen=["guard chdir", "quiet stderr", "signal mask", "file limit", "root handler"], at_import=False,
         on_call=2)
@example(chosen=["frozen clock", "blocked module", "engine logger", "locale", "stack size"], at_import=True, on_call=1)
@example(chosen=["socket timeout", "gc thresholds", "unraisablehook", "closed stdout", "guard rmtree"], at_import=False,
         on_call=1)
@example(chosen=["guard deepcopy", "guard getrlimit", "guard warn exit", "guard thread trace"], at_import=False,
         on_call=3)
def test_whatever_a_reward_changes_is_put_back_and_said_once_naming_it(chosen, at_import, tmp_path, monkeypatch,
                                                                      capsys, on_call):
    global RELEASE
    RELEASE.set()  # the threads of the previous example end
    RELEASE = threading.Event()
    reward_fence.LEFT_RUNNING.clear()
    reward_fence._SAID.clear()  # each example's warnings are its own
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(SUPPORT))
    monkeypatch.syspath_prepend(os.path.dirname(__file__))
    name = _module(tmp_path, "\n".join(MEDDLES[m][0] for m in chosen), at_import, on_call)
    capsys.readouterr()
    before = process_state()
    rewards = load_reward_functions(RewardsConfig(functions=[f"{name}:score"]), 16)
    for _ in range(3):  # said once, however often it happens (and on whichever call)
        score_completions(rewards, ["p"] * 2, ["a"] * 2, {}, [[1]] * 2)
    after = process_state()
    assert {key for key in before if before[key] != after[key]} == set()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    owner = f"reward module '{name}'" if at_import else "reward function 'score'"
    expected = [MEDDLES[m][1] for m in chosen if MEDDLES[m][1] is not None]
    kinds = {MEDDLES[m][1] if m.endswith(" hook") or m.startswith("guard ") or m == "frozen clock" else
             "environment" if m.endswith(" env") else
             "timers" if m.endswith(" timer") else m
             for m in chosen if MEDDLES[m][1] is not None}  # one line names every variable, hook and timer
    assert len(lines) == len(kinds), lines  # one line per kind of change
    for words in expected:
        assert any(line.startswith(f"warning: {owner}") and words in line for line in lines), (words, lines)
    left = reward_fence.threads_left_running()
    assert bool(left) == ("non-daemon thread" in chosen), left


def test_the_cli_ends_without_waiting_for_a_thread_a_reward_left_running(tmp_path):
    """End to end: the process exits with the run's status, naming the thread, instead of hanging."""
    (tmp_path / "thread_reward.py").write_text(
        "import threading, time\n"
        "def score(prompts, completions, **kwargs):\n"
        "    threading.Thread(target=time.sleep, args=(3600,), name='forever').start()\n"
        "    return [float(len(c) % 2) for c in completions]\n")
    args = [sys.executable, "-m", "grpo_engine", "train", "--output-dir", str(tmp_path / "run"), "--run.max_steps", "1",
            "--run.warm_start_steps", "2", "--run.progress_bar", "false", "--run.plot", "false",
            "--data.builtin_max_operand", "2", "--data.builtin_eval_size", "2", "--rollout.num_generations", "4",
            "--rollout.max_new_tokens", "4", "--optim.per_device_train_batch_size", "8",
            "--run.loss_backend", "torch", "--rewards.functions", "[thread_reward:score]"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    ending = [line for line in done.stderr.splitlines() if line.startswith("grpo-engine: ending without waiting")]
    assert len(ending) == 1 and "a reward function left running: 'forever' (started by reward function 'score')" \
        in ending[0], done.stderr[-2000:]
    assert "warning: reward function 'score' left 1 thread running that is not a daemon ('forever')" in done.stderr
    assert time.monotonic() - start < 300


@pytest.mark.parametrize("stream,fd", [("stdout", 1), ("stderr", 2), ("stdin", 0)])
def test_a_reward_that_closes_a_standard_stream_leaves_it_open(stream, fd):
    """Putting back the same stream object left it closed, and the engine's next print failed: the fence opens a
    new stream on the same descriptor (a real process: the test runner's capture has no descriptor)."""
    code = (f"import sys\nfrom grpo_engine.steps.rewards import NamedReward, score_completions\n"
            f"def score(prompts, completions, **_):\n    sys.{stream}.close()\n    return [1.0] * len(completions)\n"
            f"score_completions([NamedReward('score', score, 1.0)], ['p'], ['c'], {{}}, [[1]])\n"
            f"print('printed after', sys.stdin.closed)\nprint('said after', file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "printed after False" and "said after" in done.stderr
    assert f"reward function 'score' closed the stream on file descriptor {fd}; the engine opened it again" \
        in done.stderr


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_reward_that_reconfigures_a_standard_stream_leaves_it_as_it_was(stream):
    """sys.stdout.reconfigure(encoding='ascii', errors='strict') in a reward outlived the call: the CLI's error
    handler (backslashreplace) was gone, and the engine's next line holding a non-ASCII character (a prompt, a path)
    ended the run in UnicodeEncodeError. The stream's encoding, error handler and buffering are put back and said."""
    code = (f"import sys\nfrom grpo_engine.steps.rewards import NamedReward, score_completions\n"
            f"sys.{stream}.reconfigure(errors='backslashreplace')\n"
            f"def score(prompts, completions, **_):\n"
            f"    sys.{stream}.reconfigure(encoding='ascii', errors='strict', line_buffering=False)\n"
            f"    return [1.0] * len(completions)\n"
            f"before = (sys.{stream}.encoding, sys.{stream}.errors)\n"
            f"score_completions([NamedReward('score', score, 1.0)], ['p'], ['c'], {{}}, [[1]])\n"
            f"print('after \u00e9', (sys.{stream}.encoding, sys.{stream}.errors) == before, file=sys.{stream})\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.getcwd(), "PYTHONIOENCODING": "utf-8"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "after \u00e9 True" in getattr(done, stream), (done.stdout, done.stderr)
    assert f"reward function 'score' reconfigured sys.{stream} (its encoding, error handler or buffering); the " \
        f"engine put it back" in done.stderr, done.stderr
