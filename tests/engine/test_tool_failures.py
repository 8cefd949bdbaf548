"""Every `python -m` tool and benchmark ends a failure in one line naming the program (grpo_engine/command_failure.py),
as `grpo-engine` does: before, a results file that does not exist given to `benchmarks.model.calibrate`, an
--update-readme that is a directory, `benchmarks.gpu_plan | head -1`, a stdout closed with `>&-` or on /dev/full and
a config the schema refuses in a tool ended in tracebacks of fifteen lines or more."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from benchmarks.suite.results_file import ResultsFileError
from grpo_engine.command_failure import run_tool
from grpo_engine.config import ConfigError
from grpo_engine.state.atomic_file import FileWriteError

ROOT = Path(__file__).resolve().parents[2]
PROG = "python -m some.tool"

FAILURES = st.sampled_from([
    lambda text: FileNotFoundError(errno.ENOENT, "No such file or directory", text),
    lambda text: IsADirectoryError(errno.EISDIR, "Is a directory", text),
    lambda text: PermissionError(errno.EACCES, text),
    lambda text: FileWriteError(Path(text or "x"), OSError(errno.ENOSPC, "No space left on device")),
    lambda text: ConfigError(text), lambda text: ResultsFileError(text), lambda text: ValueError(text),
    lambda text: RuntimeError(f"[enforce fail at alloc_cpu.cpp:127]\n{text}\n\n"),
    lambda text: FloatingPointError(text),
    lambda text: ImportError(f"No module named {text!r}"), lambda text: MemoryError(text),
    lambda text: ImportError(f"libtorch_cpu.so: failed to map segment from shared object {text}"),
    lambda text: OSError(errno.EFBIG, "File too large", text),
])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(failure=FAILURES, text=st.text(max_size=80))
def test_any_named_failure_of_a_tool_is_one_line_starting_with_the_program(failure, text, capsys):
    capsys.readouterr()

    def main() -> int:
        print("some results")
        raise failure(text)

    assert run_tool(main, PROG) == 1
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{PROG}: "), lines
    assert "Traceback" not in captured.err and "some results" in captured.out


def test_argument_errors_and_help_pass_through_with_their_status(capsys):
    def main() -> int:
        raise SystemExit(2)

    with pytest.raises(SystemExit) as stop:
        run_tool(main, PROG)
    assert stop.value.code == 2
    assert run_tool(lambda: None, PROG) == 0  # a main that returns nothing succeeded


def _main_blocks() -> list[Path]:
    found = []
    for folder in (ROOT / "benchmarks", ROOT / "grpo_engine" / "tools"):
        for path in sorted(folder.rglob("*.py")):
            text = path.read_text()
            if 'if __name__ == "__main__":' in text or path.name == "__main__.py":
                found.append(path)
    return found


def test_every_tool_and_benchmark_program_runs_its_main_through_the_boundary():
    """By construction: a new `python -m` program with a bare `sys.exit(main())` fails here."""
    blocks = _main_blocks()
    assert len(blocks) >= 20, blocks
    bare = []
    for path in blocks:
        text = path.read_text()
        tail = text[text.index('if __name__ == "__main__":'):] if path.name != "__main__.py" else text
        if not re.search(r"run_tool\((main|lambda: main\(sys\.argv\[1:\]\)), \"python -m [\w.]+\"\)", tail):
            bare.append(str(path.relative_to(ROOT)))
    assert not bare, f"programs whose failures are tracebacks: {bare}"


def _run(shell: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return subprocess.run(["bash", "-c", shell], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("shell, code, line", [
    ("{python} -m benchmarks.model.calibrate {tmp}/missing.json", 1,
     "python -m benchmarks.model.calibrate: ResultsFileError: results file '{tmp}/missing.json' does not exist"),
    ("{python} -m benchmarks.gpu_plan | head -1 >/dev/null", 0, None),
    ("{python} -m benchmarks.gpu_plan >&-", 0, None),
    ("{python} -m benchmarks.gpu_plan >/dev/full", 1, "python -m benchmarks.gpu_plan: could not write to stdout"),
])
def test_programs_end_in_one_line_or_quietly(shell, code, line, tmp_path):
    done = _run(shell.format(python=sys.executable, tmp=tmp_path))
    lines = done.stderr.splitlines()
    assert done.returncode == code, done.stderr
    if line is None:
        assert lines == [], lines
    else:
        assert len(lines) == 1 and lines[0].startswith(line.format(tmp=tmp_path)), lines
