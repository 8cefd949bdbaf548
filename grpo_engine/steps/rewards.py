"""Reward functions: TRL's signature `fn(prompts, completions, **columns) -> list[float | None]`.

Built-ins: `math_accuracy` (the `\\boxed{}` answer against the dataset's answer column, +1 / -1 / -0.5 for
correct / wrong / no answer as in the seeds' guide; no optional package changes a score), `format`
(`<think>...</think><answer>...</answer>`), `length` (DAPO's soft overlong punishment). Anything else is
`package.module:function`. Besides the dataset columns, every function receives `completion_ids`.

A function declares the dataset columns it reads (`@dataset_columns("answer")`, or a `dataset_columns`
attribute); undeclared, it reads the keyword parameters it has without a default. The data is checked
against them when it loads, so a missing column stops the run before the model loads, not at step 1.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import math
import numbers
import os
import re
import sys
import traceback
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TypeVar

import numpy as np
import torch

from ..config import RewardsConfig
from ..data.row_values import lookalike_note
from ..import_path import hidden_file_note
from .reward_exits import InterruptWatch, exit_description, interrupt_watch, is_users_interrupt
from .reward_fence import fenced_arguments, reward_fence
from .reward_timeout import RewardTimeout, time_limit

RewardFunction = Callable[..., list]


# Passed to every reward function by the engine itself, not read from the dataset.
ENGINE_ARGUMENTS = ("prompts", "completions", "completion_ids")
F = TypeVar("F", bound=Callable)


def dataset_columns(*names: str) -> Callable[[F], F]:
    """Declares the dataset columns a reward function reads, checked when the data loads:

        @dataset_columns("answer")
        def my_reward(prompts, completions, **columns): ...
    """
    def declare(fn: F) -> F:
        fn.dataset_columns = tuple(names)
        return fn

    return declare


def columns_read(fn: Callable) -> tuple[str, ...]:
    """The columns `fn` declares; undeclared, its keyword parameters without a default (which a call without
    that column would fail on), the engine's own arguments aside."""
    declared = getattr(fn, "dataset_columns", None)
    if declared is not None:
        return (declared,) if isinstance(declared, str) else tuple(declared)
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: nothing to infer
        return ()
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in parameters
                 if p.kind in keyword and p.default is inspect.Parameter.empty and p.name not in ENGINE_ARGUMENTS)


class RewardFunctionError(RuntimeError):
    """A reward function failed or misbehaved; `user_traceback` holds its own traceback when it raised."""

    user_traceback: Optional[str] = None


# ------------------------------------------------------------------------------------------ math answers

def _brace_depths(text: str) -> Optional[list[int]]:
    """The brace depth after each character (LaTeX's escaped \\{ and \\} are text, not braces), or None when a
    closing brace has no opening one (a stray `}`: the text is malformed)."""
    depths, depth, i = [], 0, 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            depths += [depth, depth]
            i += 2
            continue
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth < 0:
            return None
        depths.append(depth)
        i += 1
    return depths


def extract_boxed(text: str) -> Optional[str]:
    """Content of the last `\\boxed{...}` (nested braces allowed), or None: no box, or a malformed one (the last
    box never closes, is not followed by a brace, or the text has a closing brace without an opening one, as in
    `\\boxed{6}}`). An earlier box never stands in for a malformed last one."""
    start = text.rfind("\\boxed")
    depths = _brace_depths(text)
    if start == -1 or depths is None:
        return None
    brace = start + len("\\boxed")
    while brace < len(text) and text[brace] == " ":
        brace += 1
    if brace >= len(text) or text[brace] != "{":
        return None
    outer = depths[brace] - 1  # the depth the box's own brace closes back to
    close = next((i for i in range(brace + 1, len(text)) if depths[i] == outer and text[i] == "}"), None)
    return None if close is None else text[brace + 1: close]


def reference_answer(answer: Any) -> Optional[str]:
    """The gold answer: GSM8K's text after '####', a \\boxed{} in a worked solution, or the value itself."""
    if answer is None:
        return None
    text = str(answer)
    if "####" in text:
        return text.split("####")[-1].strip()
    boxed = extract_boxed(text)
    return boxed if boxed is not None else text.strip()


# The fonts and boxes of text in math (their content is the value) and LaTeX's notation that draws no value: its
# spacing commands (\\quad, ~, \\hspace{1em}), placeholders that draw nothing (\\phantom{1}), style switches
# (\\displaystyle), the inline / display math delimiters and an empty group. Each alone, as a reference and in a box,
# matched itself (`\\boxed{\\quad}` scored correct against `\\quad`) until it is dropped with the rest.
_TEXT_WRAPPER = re.compile(r"\\(?:text(?:bf|it|rm|sf|tt|normal)?|math(?:rm|bf|it|sf|tt|normal)|mbox|operatorname)"
                           r"\*?\{([^{}]*)\}")
_DRAWS_NO_VALUE = re.compile(r"\\(?:[hv]?phantom|[hv]space\*?)\{[^{}]*\}|\\(?:qquad|quad|enspace|thinspace|medspace|"
                             r"thickspace|neg(?:thin|med|thick)space|(?:script)*(?:display|text|script)style)"
                             r"(?![A-Za-z])|\\[()\[\]:]|~")
_EMPTY_GROUP = re.compile(r"\{\s*\}")
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}")


def normalize_answer(answer: str) -> str:
    """Drop the notation that does not change a value: $, spacing, \\text{}, \\left/\\right, units words."""
    text = _DRAWS_NO_VALUE.sub("", _TEXT_WRAPPER.sub(r"\1", answer.strip()))
    while _EMPTY_GROUP.search(text):  # {{}} is empty once its inner group is gone
        text = _EMPTY_GROUP.sub("", text)
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", "$", "^\\circ", "^{\\circ}", "\\%", "%"):
        text = text.replace(token, "")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    # A trailing backslash is a LaTeX space (`\ `) or line break (`\\`) that a strip cut short (`5\ ` is 5).
    text = re.sub(r"\s+", "", text).rstrip(".\\")
    if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", text):  # 1,234 -> 1234
        text = text.replace(",", "")
    return text


def _as_number(text: str) -> Optional[Fraction]:
    frac = _FRAC.fullmatch(text)
    try:
        if frac:
            return Fraction(frac.group(1)) / Fraction(frac.group(2))
        return Fraction(text)  # integers, decimals and a/b
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(predicted: str, gold: str) -> bool:
    pred, ref = normalize_answer(predicted), normalize_answer(gold)
    if not pred or not ref:  # notation alone (`$ $`, `\text{}`) is no value: it matches nothing, itself neither
        return False
    if pred == ref:
        return True
    pred_num, ref_num = _as_number(pred), _as_number(ref)
    return pred_num is not None and ref_num is not None and pred_num == ref_num


_OPERATOR = re.compile(r"(?<=[\d})])\s*(?:[-+*/^]|\\cdot|\\times|\\div)\s*(?=[\d({\\])")


def final_answer(boxed: str) -> Optional[str]:
    """What a box answers: the text after its last `=` (`x = 5`, `3+5=8`); None when that is an unevaluated
    computation of numbers (`2+3`, `4 \\times 2`): restating the question is not answering it. A single fraction
    (`3/4`, `\\frac{3}{4}`) and a signed number are values, not computations."""
    answer = boxed.rsplit("=", 1)[-1]
    value = normalize_answer(answer)
    if _as_number(value) is not None or _FRAC.fullmatch(value):
        return answer
    return None if _OPERATOR.search(value) else answer


# The values math_accuracy reads as an answer: text, or a number (not a bool, which str() would make "True").
# A list or an object would be read as its text silently, scored wrong for every completion.
ANSWER_TYPES = (str, int, float, type(None))


def make_math_accuracy(correct: float, wrong: float, no_answer: float, answer_column: str) -> RewardFunction:
    @dataset_columns(answer_column)
    def math_accuracy(prompts: list, completions: list, **columns: Any) -> list[Optional[float]]:
        if answer_column not in columns:
            raise KeyError(f"math_accuracy needs the dataset column {answer_column!r} (rewards.answer_column); "
                           f"columns present: {sorted(k for k in columns if k != 'completion_ids')}")
        scores: list[Optional[float]] = []
        for completion, answer in zip(completions, columns[answer_column]):
            gold = reference_answer(answer)
            # `x = 5` answers 5. A blank reference ('', '#### ', '\\boxed{}', 'x =') is no answer, as null is: before,
            # every completion of its row scored wrong, and evaluation data without answers read as accuracy 0.0.
            # So is one of notation alone (`$ $`, `\text{}`), which normalizes to nothing: it scored a box of the
            # same notation correct.
            gold = None if gold is None else gold.rsplit("=", 1)[-1].strip() or None
            gold = None if gold is None or not normalize_answer(gold) else gold
            boxed = extract_boxed(completion)
            predicted = None if boxed is None else final_answer(boxed)
            if gold is None:
                scores.append(None)  # no reference: this sample is left out of the reward
            elif boxed is None:
                scores.append(no_answer)
            else:
                scores.append(correct if predicted is not None and answers_match(predicted, gold) else wrong)
        return scores

    math_accuracy.dataset_column_types = {answer_column: ANSWER_TYPES}
    return math_accuracy


_FORMAT = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)


def format_reward(prompts: list, completions: list, **_: Any) -> list[float]:
    """1.0 when the completion is exactly a <think> block followed by an <answer> block, else 0.0."""
    return [1.0 if _FORMAT.match(c) else 0.0 for c in completions]


def make_length_reward(max_new_tokens: int, cache: int) -> RewardFunction:
    """DAPO's soft overlong punishment: 0 up to max - cache tokens, then linearly down to -1 at max."""
    def length(prompts: list, completions: list, completion_ids: list, **_: Any) -> list[float]:
        start = max_new_tokens - cache
        scores = []
        for ids in completion_ids:
            n = len(ids)
            scores.append(0.0 if n <= start or cache == 0 else -min(1.0, (n - start) / cache))
        return scores

    return length


# ---------------------------------------------------------------------------------------- resolution

@dataclass
class NamedReward:
    name: str
    fn: RewardFunction
    weight: float
    timeout: Optional[float] = None  # seconds one call may take (rewards.timeout_seconds); None: no limit

    @property
    def columns(self) -> tuple[str, ...]:
        return columns_read(self.fn)


# The config key that names a built-in's column, for the message when the data lacks it.
COLUMN_KEYS = {"math_accuracy": "rewards.answer_column"}


def check_reward_columns(rewards: list[NamedReward], rows: list[dict[str, Any]], source: str,
                         prompt_column: str = "prompt") -> None:
    """Every row holds every column a reward function reads (a null value is fine: "not scored"), of the types the
    function declares (`dataset_column_types`), and no column takes the name of an argument the engine passes
    itself (a call would fail with "got multiple values for keyword argument", after the model loaded)."""
    reserved = next((c for c in ENGINE_ARGUMENTS if c != prompt_column and any(c in row for row in rows)), None)
    if reserved is not None:
        row = next(i for i, r in enumerate(rows) if reserved in r)
        raise RewardFunctionError(f"dataset {source!r} row {row} has a column {reserved!r}, a name the engine passes "
                                  f"to every reward function itself ({', '.join(ENGINE_ARGUMENTS)}); rename that "
                                  f"column")
    columns = sorted({key for row in rows for key in row if key != prompt_column})
    for reward in rewards:
        for column in reward.columns:
            if column == prompt_column:  # handed over as `prompts`, rendered, never as a column of its own name
                raise RewardFunctionError(f"reward function {reward.name!r} reads the column {column!r}"
                                          f"{_column_key(reward)}, which is data.prompt_column: the prompt reaches a "
                                          f"reward function as `prompts`; use another column")
            missing = next((i for i, row in enumerate(rows) if column not in row), None)
            if missing is None:
                _check_column_types(reward, column, rows, source)
                continue
            whole = all(column not in row for row in rows)
            where = f"has no {column!r} column" if whole else f"row {missing} has no {column!r} column"
            raise RewardFunctionError(f"dataset {source!r} {where}, which reward function {reward.name!r} "
                                      f"reads{_column_key(reward)}; columns: {sorted(rows[missing])}"
                                      f"{lookalike_note(column, rows[missing])}")
        _check_signature(reward, columns, source)  # after the columns it reads: a missing one is the cause


def _check_signature(reward: NamedReward, columns: list[str], source: str) -> None:
    """The function takes the engine's call, fn(prompts=, completions=, completion_ids=, **every other column), as
    TRL makes it: a function without those parameters or **kwargs would raise at step 1, after the model loaded."""
    try:
        signature = inspect.signature(reward.fn)
    except (TypeError, ValueError):  # a builtin without a signature: its call says
        return
    try:
        signature.bind(**{name: None for name in (*ENGINE_ARGUMENTS, *columns)})
    except TypeError as exc:
        raise RewardFunctionError(f"reward function {reward.name!r} cannot take the call the engine makes, "
                                  f"fn(prompts=, completions=, completion_ids=, **the columns of {source!r}): {exc}; "
                                  f"give it the signature fn(prompts, completions, **kwargs)") from None


def _column_key(reward: NamedReward) -> str:
    builtin = reward.name in COLUMN_KEYS and reward.fn.__module__ == __name__
    return f" (set by {COLUMN_KEYS[reward.name]})" if builtin else ""


def _check_column_types(reward: NamedReward, column: str, rows: list[dict[str, Any]], source: str) -> None:
    types = (getattr(reward.fn, "dataset_column_types", None) or {}).get(column)
    if not types:
        return
    for i, row in enumerate(rows):
        value = row[column]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            expected = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise RewardFunctionError(f"dataset {source!r} row {i} column {column!r}: reward function "
                                      f"{reward.name!r}{_column_key(reward)} reads {expected}, got "
                                      f"{type(value).__name__} {shown_value(value)}")


def resolve_function(spec: str, config: RewardsConfig, max_new_tokens: int) -> RewardFunction:
    if spec == "math_accuracy":
        return make_math_accuracy(config.math_correct, config.math_wrong, config.math_no_answer, config.answer_column)
    if spec == "format":
        return format_reward
    if spec == "length":
        return make_length_reward(max_new_tokens, config.length_cache)
    if ":" not in spec:
        raise RewardFunctionError(f"unknown reward function {spec!r}: use math_accuracy, format, length or "
                                  f"'package.module:function'")
    module_name, _, attr = spec.partition(":")
    # As `python script.py` would: a module in the current directory is importable, even from the
    # `grpo-engine` console script (whose sys.path holds its own directory instead). Last, as under `python -m`
    # (grpo_engine/import_path.py): a file there never hides a library imported after the rewards.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        # The call's time limit holds for the import too: a module that waits at import (on a server, a lock, stdin)
        # hung the run before its first step with not a line.
        with interrupt_watch() as watch, reward_fence(f"reward module {module_name!r} (imported for {spec!r})"), \
                time_limit(config.timeout_seconds, f"the import of reward module {module_name!r}"):
            module = importlib.import_module(module_name)
    except RewardTimeout:
        raise RewardFunctionError(f"reward function {spec!r}: module {module_name!r} did not finish importing within "
                                  f"{config.timeout_seconds:g} s (rewards.timeout_seconds; null for no limit)") from None
    except BaseException as exc:  # anything while the user's module runs, sys.exit too: one line naming where
        if is_users_interrupt(exc, watch):
            raise
        raise RewardFunctionError(f"reward function {spec!r}: cannot import module {module_name!r}: "
                                  f"{import_failure(exc)}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardFunctionError(f"reward function {spec!r}: module {module_name!r} has no callable {attr!r}"
                                  f"{hidden_file_note(module_name, module)}")
    kind = _no_scores_kind(fn)
    if kind:
        raise RewardFunctionError(f"reward function {spec!r}: {attr!r} is {kind}, and calling it returns no list of "
                                  "scores; write a plain function (def) that returns one score per completion")
    problem = declaration_problem(fn)
    if problem:
        raise RewardFunctionError(f"reward function {spec!r}: {problem}")
    return fn


def _is_types(value: Any) -> bool:
    """A type, or a tuple of types: what isinstance takes as its second argument."""
    return isinstance(value, type) or (isinstance(value, tuple) and bool(value)
                                       and all(isinstance(t, type) for t in value))


def declaration_problem(fn: Callable) -> Optional[str]:
    """What is wrong with what `fn` declares of the data (`dataset_columns`, `dataset_column_types`), or None. Both
    are read when the data loads: `dataset_columns = 5` failed there with a TypeError traceback, `[1, None]` was
    "no 1 column", a generator was read once (no column the second time), and a type given as its name
    (`{'answer': 'str'}`) failed inside isinstance."""
    columns = getattr(fn, "dataset_columns", None)
    if columns is not None and not isinstance(columns, str) and (
            not isinstance(columns, (list, tuple)) or not all(isinstance(c, str) and c for c in columns)):
        return (f"its dataset_columns is {shown_value(columns)}; declare the columns it reads as names: a list of "
                f"texts (@dataset_columns('answer', ...))")
    if isinstance(columns, str) and not columns:
        return "its dataset_columns is an empty text; declare the columns it reads as names"
    types = getattr(fn, "dataset_column_types", None)
    if types is not None and (not isinstance(types, dict) or not all(
            isinstance(column, str) and _is_types(kinds) for column, kinds in types.items())):
        return (f"its dataset_column_types is {shown_value(types)}; declare a mapping of column name to a type or a "
                f"tuple of types ({{'answer': (str, int)}})")
    return None


def _no_scores_kind(fn: Callable) -> Optional[str]:
    """What `fn` is when calling it cannot return the list of scores (the engine calls it, and awaits or iterates
    nothing): a class (its call makes an instance), an async function (a coroutine), a generator function (a
    generator). Each was refused only after a whole rollout, by what it returned (a coroutine also warned that it
    was never awaited). A functools.partial of one is one too."""
    if inspect.isclass(fn):
        return "a class"
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        return "an async function"
    if inspect.isasyncgenfunction(fn):
        return "an async generator function"
    if inspect.isgeneratorfunction(fn) or inspect.isgeneratorfunction(getattr(fn, "__call__", None)):
        return "a generator function"
    return None


_ENGINE_DIR = Path(__file__).resolve().parents[1]


def import_failure(exc: BaseException) -> str:
    """Where a module's import failed, as `FILE:LINE: Error: message` (the innermost frame of the user's files:
    not importlib's own), or the bare error when no file is known (a module that does not exist)."""
    message = exit_description(exc) or f"{type(exc).__name__}: {exc}"
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}: {type(exc).__name__}: {exc.msg}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<") and "importlib" not in Path(f.filename).parts
              and not Path(f.filename).is_relative_to(_ENGINE_DIR)]  # the engine's call is not where it failed
    if isinstance(exc, ModuleNotFoundError) and not frames:
        return message
    # An exit or an interrupt is the module's own doing at its line, not where a library (argparse) raised it.
    frame = frames[-1] if isinstance(exc, Exception) else frames[0] if frames else None
    return f"{frame.filename}:{frame.lineno}: {message}" if frame else message


def reward_names(specs: list[str]) -> list[str]:
    """Each function's name in the metrics (`rewards/<name>/mean`): the function's own name, or its whole spec
    when two functions share that name, so that no function's metrics overwrite another's."""
    short = [spec.rpartition(":")[2] if ":" in spec else spec for spec in specs]
    names = [spec if short.count(name) > 1 else name for spec, name in zip(specs, short)]
    # The same spec listed twice: numbered by its place ('#' is in no function name or spec)
    return [f"{name}#{names[:i].count(name) + 1}" if names.count(name) > 1 else name for i, name in enumerate(names)]


def load_reward_functions(config: RewardsConfig, max_new_tokens: int) -> list[NamedReward]:
    weights = config.weights or [1.0] * len(config.functions)
    return [NamedReward(name, resolve_function(spec, config, max_new_tokens), float(w), config.timeout_seconds)
            for name, spec, w in zip(reward_names(list(config.functions)), config.functions, weights)]


def code_fingerprint(rewards: list[NamedReward], paths: bool = True) -> Optional[dict[str, Any]]:
    """What a checkpoint keeps of the user's reward code: a SHA-256 over the source files of the modules that
    define the reward functions (the built-in rewards are the engine's own code), so a resume can say the rewards
    changed under it. None when every reward is built in. `paths=False`: over the files' names and contents only
    (the processes of a multi-node launch find the same module at each host's own path)."""
    sources = [_source_file(reward.fn) for reward in rewards if not _is_builtin(reward.fn)]
    files = sorted({Path(source) for source in sources if source})
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path if paths else path.name).encode("utf-8", "replace") + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"")
    return {"source": ", ".join(path.name for path in files), "rows": len(files), "sha256": digest.hexdigest()}


def _source_file(fn: Callable) -> Optional[str]:
    """The file that defines a reward: a function's or method's own, a functools.partial's function's, a callable
    object's class's; None for one with no Python source (a C function such as math.fsum). inspect.getsourcefile
    takes functions, methods and classes only: a partial or a callable object failed the run with its TypeError."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not (inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isclass(fn)):
        fn = type(fn)
    try:
        return inspect.getsourcefile(fn)
    except TypeError:  # a built-in class or function: no source file
        return None


def _is_builtin(fn: RewardFunction) -> bool:
    module = inspect.getmodule(fn)
    return module is not None and module.__name__ == __name__


class NotAReward(TypeError):
    """A returned value that is not a reward: (what it is, in a bounded number of characters; what was expected)."""


def shown_value(value: Any, limit: int = 60) -> str:
    """What a returned value is, in at most about `limit` characters: its type and the start of its repr (an
    integer by its size: the repr of 10**5000 is refused by Python itself), never the user's whole object."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        number = int(value)
        if abs(number) > 10**18:
            return f"an integer of {number.bit_length()} bits (about 10**{int(number.bit_length() * 0.30103)})"
    try:
        text = repr(value)
    except Exception as exc:  # a user's __repr__ that raises
        text = f"<{type(value).__name__} whose repr raised {type(exc).__name__}>"
    text = " ".join(text[:4 * limit].split())  # one line: a tensor's or a user's repr may span several
    return text if len(text) <= limit else f"{text[:limit]}... ({type(value).__name__})"


def _as_reward(value: Any) -> Optional[float]:
    """TRL's reading of one returned value: None or NaN is "not scored"; bools and numpy / 0-d tensor
    scalars are numbers; a masked element of a NumPy masked array is "not scored" too (its value read as 0.0 before).
    Anything else, an infinity, or a number past float64's range is a NotAReward."""
    if value is np.ma.masked:
        return None
    if isinstance(value, (np.ndarray, torch.Tensor)) and value.ndim == 0:
        try:
            value = value.item()
        except Exception:  # a tensor with no value to read (on the meta device), a user's subclass
            raise NotAReward(shown_value(value), "a finite number") from None
    if value is None:
        return None
    if not isinstance(value, (bool, np.bool_, numbers.Real)):
        raise NotAReward(shown_value(value), "a finite number")
    try:
        number = float(value)
    except (OverflowError, ArithmeticError):  # 10**400, a Fraction of such
        raise NotAReward(shown_value(value), "a finite number within float64's range (about 1.8e308)") from None
    except Exception:  # a user's number type whose __float__ raises, whatever it raises
        raise NotAReward(shown_value(value), "a finite number (its float() raised)") from None
    if math.isnan(number):
        return None
    if not math.isfinite(number):
        raise NotAReward(shown_value(value), "a finite number")
    return number


def score_completions(rewards: list[NamedReward], prompts: list[str], completions: list[str],
                      columns: dict[str, list], completion_ids: list[list[int]],
                      sources: Optional[Sequence[str]] = None) -> torch.Tensor:
    """[N, F] float64 rewards (a function may return any finite float), NaN where it returned None; a misbehaving
    function raises naming it, and for a value it returned, the dataset row of that completion (`sources`: where each
    completion's prompt came from, e.g. "dataset 'd.jsonl' row 5").

    A function may return a list, tuple, numpy array or 1-D tensor of N values, as TRL accepts.
    """
    n = len(completions)
    table = torch.full((n, len(rewards)), math.nan, dtype=torch.float64)
    for j, reward in enumerate(rewards):
        watch = InterruptWatch(seen=True)  # until the function is called, a KeyboardInterrupt is a Ctrl-C
        try:
            arguments = fenced_arguments(prompts=prompts, completions=completions, completion_ids=completion_ids,
                                         **columns)
            with interrupt_watch() as watch, reward_fence(f"reward function {reward.name!r}"), \
                    time_limit(reward.timeout, f"reward function {reward.name!r}"):
                values = reward.fn(**arguments)
        except RewardTimeout:
            raise RewardFunctionError(f"reward function {reward.name!r} did not return within {reward.timeout:g} s "
                                      f"(rewards.timeout_seconds; null for no limit)") from None
        except BaseException as exc:  # sys.exit, its own KeyboardInterrupt, CancelledError: said as an Exception is
            if is_users_interrupt(exc, watch):
                raise
            said = exit_description(exc) or f"raised {type(exc).__name__}: {exc}{_text_arguments_hint(exc)}"
            error = RewardFunctionError(f"reward function {reward.name!r} {said}")
            if isinstance(exc, SystemExit):  # its line says all: no traceback, as before
                raise error from None
            # The user's bug is inside the function: keep its frames, without this caller's.
            error.user_traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next))
            raise error from exc
        for i, score in enumerate(_returned_scores(reward.name, values, n, sources)):
            if score is not None:
                table[i, j] = score
    return table


def _text_arguments_hint(exc: Exception) -> str:
    """A function written for TRL's conversational format (`completion[0]["content"]`) indexes the text the engine
    passes as if it were a list of messages: said, since its error names only string indices."""
    if isinstance(exc, TypeError) and "string indices must be integers" in str(exc):
        return (" (prompts and completions reach a reward function as text, not as TRL's lists of chat messages: "
                "read `completion`, not `completion[0]['content']`)")
    return ""


def _returned_scores(name: str, values: Any, n: int, sources: Optional[Sequence[str]] = None
                     ) -> list[Optional[float]]:
    """The n scores a function returned (a list, tuple, numpy array or 1-D tensor, as TRL accepts), each read by
    `_as_reward`; anything else is one line naming the function, what it returned and what was expected."""
    if isinstance(values, (np.ndarray, torch.Tensor)) and values.ndim == 1:
        values = list(values)
    elif isinstance(values, (list, tuple)):
        values = list(values)  # a subclass's __len__ may disagree with what it holds: counted on what is read
    if not isinstance(values, (list, tuple)) or len(values) != n:
        got = f"{len(values)} values" if isinstance(values, (list, tuple)) else shown_value(values)
        raise RewardFunctionError(f"reward function {name!r} must return a list of {n} floats (one per "
                                  f"completion), got {got}")
    scores = []
    for i, value in enumerate(values):
        try:
            scores.append(_as_reward(value))
        except NotAReward as exc:
            shown, expected = exc.args
            source = f" ({sources[i]})" if sources is not None else ""
            raise RewardFunctionError(f"reward function {name!r} returned {shown} for completion {i}{source}; "
                                      f"expected {expected}, a bool or None") from None
    return scores
