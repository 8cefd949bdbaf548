"""The value types of the command-line options that are not config keys (eval's --batch-size, bench's sizes,
serve's --port, the tools' and benchmarks' counts, lists of names and result-file names): each checks its range
where argparse reads the value, so a bad one is the parser's one-line error naming the flag, before any work.
(Config keys are typed by the schema instead: grpo_engine/config/schema.py.)

argparse's plain `int` took `--batch-size 0` and `-3`, and eval then ran on with a batch of one; `float` took
`--budget-gb nan`, which failed later as "cannot convert float NaN to integer", naming nothing.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Callable, Optional, Sequence

# The largest count any option takes: what a C int holds, the narrowest integer the libraries below take.
MAX_COUNT = 2**31 - 1
_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+", re.ASCII)


def bounded_int(low: int, high: int = MAX_COUNT, what: str = "an integer") -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high]."""
    def parse(text: str) -> int:
        # ASCII digits only, as the config keys take them: int() also reads '1_0' and other scripts' digits ('５',
        # '٣'), which a reader of the command line does not see as the number that runs
        if not _WHOLE_NUMBER.fullmatch(text.strip()):
            raise argparse.ArgumentTypeError(f"expected {what} from {low} to {high:,}, got {text[:40]!r}")
        value = int(text.strip(), 10)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {what} from {low} to {high:,}, got {value}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its own messages
    return parse


def positive_float(what: str = "a number", high: Optional[float] = None) -> Callable[[str], float]:
    """An argparse type: a finite number > 0 (and <= high when given)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} > 0, got {text[:40]!r}") from None
        if not math.isfinite(value) or value <= 0 or (high is not None and value > high):
            limit = f" and at most {high:g}" if high is not None else ""
            raise argparse.ArgumentTypeError(f"expected {what}, a finite number > 0{limit}, got {text[:40]!r}")
        return value

    parse.__name__ = "number"
    return parse


def multiple_of(step: int, high: int = MAX_COUNT) -> Callable[[str], int]:
    """An argparse type: a whole number > 0 that `step` divides (a model's width over heads of `step`)."""
    within = bounded_int(step, high, f"a multiple of {step}")

    def parse(text: str) -> int:
        value = within(text)
        if value % step:
            raise argparse.ArgumentTypeError(f"expected a multiple of {step}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


positive_int = bounded_int(1)
port_number = bounded_int(1, 65535, "a port number")


def thread_count_type() -> Callable[[str], int]:
    """An argparse type: torch CPU threads, at most one per CPU this process may run on (more only oversubscribe
    them, and a count in the thousands made OpenMP fail to create its threads or crash the process)."""
    from .resource_limits import usable_cpus

    cpus = usable_cpus()
    return bounded_int(1, cpus, f"a thread count (this process may run on {cpus} CPU{'s' * (cpus != 1)})")


def names_from(known: Sequence[str], what: str = "names") -> Callable[[str], tuple[str, ...]]:
    """An argparse type: comma-separated names, at least one, each one of `known`, none twice (a misspelt path or
    operation was run as a failure, or skipped, after the others' work)."""
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(name.strip() for name in text.split(","))
        unknown = next((name for name in names if name not in known), None)
        if unknown is not None or len(set(names)) != len(names):
            problem = f"{unknown!r:.40} is not one of them" if unknown is not None else "a name is given twice"
            raise argparse.ArgumentTypeError(f"expected comma-separated {what} of {', '.join(known)}: {problem}")
        return names

    parse.__name__ = "names"
    return parse


def file_name(text: str) -> str:
    """An argparse type: a file's name alone, which the command places in its results directory (a name with a
    directory part wrote outside it, or into a directory that does not exist after the work)."""
    if not text or text in (".", "..") or "/" in text or "\\" in text or "\0" in text or text != text.strip():
        raise argparse.ArgumentTypeError(f"expected a file name without a directory part, got {text[:40]!r}")
    return text


file_name.__name__ = "name"


def path_text(text: str) -> str:
    """An argparse type: a path of a form a file system takes (no control character, within its length bounds),
    refused naming the flag before anything looks for it (past the bounds that look was an OSError naming nothing)."""
    from .config.path_form import path_form_problem

    problem = path_form_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"expected {problem}, got {text[:40]!r}{'...' if len(text) > 40 else ''}")
    return text


path_text.__name__ = "path"


# The files and directories a tool writes its results to, and the files it updates, checked where argparse reads
# them: `benchmarks.suite.report --plots FILE`, `kernel_report --out FILE`, `demo_seeds --output-dir FILE` ended in
# a traceback, the kernel report's after half a minute of compiling, demo_seeds' after torch's import; a `--out` in
# a directory that is a file, or a file that is a directory, was found only when the results were written.

def _path_problem(check: Callable[[str, str], None], text: str) -> None:
    """`check(text, key)`'s one-line refusal (it names the path after `key`) as the parser's error."""
    from .state.path_limits import PathTooLong
    from .state.run_lock import RunDirectoryError

    path_text(text)
    try:
        check(text, "the path")
    except (RunDirectoryError, PathTooLong) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def output_file(text: str) -> str:
    """An argparse type: a file the command writes whole (a report, a table): not a directory nor a special file,
    and in a directory it may write or create; none of a run directory's own files."""
    from .state.run_lock import check_output_file

    _path_problem(check_output_file, text)
    return text


def output_directory(text: str) -> str:
    """An argparse type: a directory the command writes files into, there or made: not a file, nor under one, and
    writable."""
    from .state.run_lock import check_writable_dir

    _path_problem(check_writable_dir, text)
    return text


def file_to_update(text: str) -> str:
    """An argparse type: an existing regular file the command rewrites part of (a README's generated block)."""
    path_text(text)
    from pathlib import Path

    if not Path(text).is_file():
        what = ("a directory" if Path(text).is_dir() else "not there" if not Path(text).exists()
                else "not a regular file")
        raise argparse.ArgumentTypeError(f"expected an existing file to update, got {text[:60]!r}, which is {what}")
    return text


output_file.__name__ = output_directory.__name__ = file_to_update.__name__ = "path"
