"""`python -m grpo_engine ...` looks up the engine's libraries before the working directory's files.

`python -m` puts the working directory first on sys.path, so a user's file named as a module the engine or its
libraries import later (yaml.py, tqdm.py, or the standard library's profile.py, queue.py, email/, ...) was imported
in its place: a project folder holding a `profile.py` stopped `train` with a traceback from inside torch or pyyaml
("module 'yaml' has no attribute 'SafeLoader'"). Moved to the end, the directory still serves what only it holds
(a reward module, a checkout's `benchmarks`), as it does for the `grpo-engine` script (steps/rewards.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def _is_the_program() -> bool:
    """Whether this process is the engine's command: `python -m grpo_engine...` (sys.argv[0] is "-m" while runpy
    imports the package) or the `grpo-engine` script. A program that imports grpo_engine is not."""
    return sys.argv[:1] == ["-m"] or Path(sys.argv[0] if sys.argv else "").stem == "grpo-engine"


def libraries_first() -> None:
    """When this process is the engine's command, moves every sys.path entry that is the working directory behind
    the installed libraries: the one `python -m` puts first, and one PYTHONPATH names (`PYTHONPATH=.`, a habit from
    running a project's scripts), which hid them just the same. A program that imports grpo_engine keeps its
    sys.path as it made it."""
    if not _is_the_program():
        return
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:  # deleted under the shell: the CLI says so in one line (cli.working_directory_problem)
        return
    # a checkout run from its own directory keeps it first: the engine came from there, and its loss library must too
    if os.path.realpath(Path(__file__).resolve().parent.parent) == cwd:
        return
    here = [entry for entry in sys.path if entry == "" or os.path.realpath(entry) == cwd]
    if here:
        sys.path[:] = [entry for entry in sys.path if entry not in here] + here


def hidden_file_note(module_name: str, module: object) -> str:
    """For a reward module that lacks the function named: a note when the module imported is an installed one and the
    working directory holds a file of that name, which the library order above leaves out ("" otherwise)."""
    top = module_name.split(".")[0]
    try:
        cwd = os.getcwd()
    except OSError:
        return ""
    own = [name for name in (f"{top}.py", os.path.join(top, "__init__.py")) if os.path.isfile(os.path.join(cwd, name))]
    where = getattr(module, "__file__", None) or ""
    if not own or not where or Path(where).resolve().is_relative_to(Path(cwd).resolve()):
        return ""
    return (f" (the installed module {top!r} at {where} was imported, not ./{own[0]}: a working directory's file "
            f"never hides an installed module; rename the file, e.g. my_{top}.py, and the reward spec with it)")
