"""The engine under the interpreter's own options and surroundings: `python -OO` (no docstrings), warnings made
errors (`-W error`, `-X dev`, PYTHONWARNINGS), `python -m` (or the script, with PYTHONPATH naming the directory)
from a directory holding files named as modules, and
`-S` (no site-packages)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_engine.config import RewardsConfig
from grpo_engine.steps.rewards import RewardFunctionError, resolve_function
from repo_paths import ROOT

PACKAGES = ("grpo_engine", "grpo_kernels", "benchmarks")


def _run(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_no_program_reads_a_docstring_at_run_time():
    """By construction: `__doc__.split(...)` (or [...]) is None's attribute under -OO; doc_summary reads it."""
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.Attribute, ast.Subscript)) and getattr(node.value, "id", None) == "__doc__":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"use grpo_engine.cli_parser.doc_summary(__doc__): {found}"


@pytest.mark.parametrize("args", [["--help"], ["train", "--help"], ["eval", "--help"], ["bench", "--help"]])
def test_help_without_docstrings(args, tmp_path):
    result = _run(["-OO", "-m", "grpo_engine", *args], tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "usage: grpo-engine" in result.stdout


@pytest.mark.parametrize("args", [["train"], ["eval", "--model", "org/model"]])
def test_a_command_that_loads_a_model_under_OO_is_one_line_before_any_work(args, tmp_path):
    """transformers cannot define a model's classes without docstrings: said before the run directory is made."""
    result = _run(["-OO", "-m", "grpo_engine", *args, "--run.output_dir", str(tmp_path / "run")], tmp_path)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
    assert "python -OO" in result.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("options, env", [(["-W", "error"], None), (["-X", "dev"], None),
                                          ([], {"PYTHONWARNINGS": "error::ResourceWarning"})])
def test_warnings_made_errors_leave_no_traceback_at_exit(options, env, tmp_path):
    """The reward watchdog, started by the first reward call, is reaped when the process ends: a Popen still running
    then is a ResourceWarning, an "Exception ignored" traceback under these options after a run that succeeded."""
    script = "from grpo_engine.steps import stop_watchdog as w; w.arm(60, 'stuck'); w.disarm()"
    result = _run([*options, "-c", script], tmp_path, env)
    assert result.returncode == 0 and result.stderr == "", result.stderr[-2000:]


# Modules `grpo-engine train --help` imports after `python -m` has put the working directory on sys.path (none is
# loaded by the interpreter's start): the standard library's and the engine's libraries'.
IMPORTED_LATER = ("yaml", "pydantic", "difflib", "calendar", "email", "uuid", "decimal", "csv", "tokenize", "numbers")


# How the working directory comes onto sys.path besides `python -m`'s own entry: PYTHONPATH naming it (`.`, or its
# full path), before the engine's path (which hid the libraries before, for -m and the script alike)
ON_THE_PATH = {"-m only": lambda cwd: [], "PYTHONPATH=.": lambda cwd: ["."], "PYTHONPATH=cwd": lambda cwd: [str(cwd)]}
# The `grpo-engine` script as pip writes it (named so; its own directory, not the working one, is first on sys.path)
SCRIPT = "import sys\nfrom grpo_engine.cli import main\nsys.exit(main())\n"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(IMPORTED_LATER), as_package=st.booleans(), on_the_path=st.sampled_from(sorted(ON_THE_PATH)),
       script=st.booleans())
def test_a_working_directorys_file_does_not_hide_a_library(name, as_package, on_the_path, script, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("project")
    file = cwd / name / "__init__.py" if as_package else cwd / f"{name}.py"
    file.parent.mkdir(exist_ok=True)
    file.write_text("raise SystemExit('the working directory\\'s file was imported')\n")
    program = ["-m", "grpo_engine"]
    if script:
        program = [str(tmp_path_factory.mktemp("bin") / "grpo-engine")]
        Path(program[0]).write_text(SCRIPT)
    python_path = os.pathsep.join([*ON_THE_PATH[on_the_path](cwd), str(ROOT)])
    result = _run([*program, "train", "--help"], cwd, env={"PYTHONPATH": python_path})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage: grpo-engine train" in result.stdout


def test_a_reward_module_named_as_an_installed_one_is_said(tmp_path, monkeypatch):
    """The working directory comes after the libraries for reward modules too: the user's yaml.py is not the module
    imported for 'yaml:score', and the line says why."""
    (tmp_path / "yaml.py").write_text("def score(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RewardFunctionError, match=r"has no callable 'score' \(the installed module 'yaml' .* not "
                                                  r"\./yaml\.py.*rename the file"):
        resolve_function("yaml:score", RewardsConfig(), 8)


def test_no_site_packages_is_said_not_only_install(tmp_path):
    result = _run(["-S", "-m", "grpo_engine", "train", "--help"], tmp_path)
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr[-2000:]
    assert "started with -S" in result.stderr
