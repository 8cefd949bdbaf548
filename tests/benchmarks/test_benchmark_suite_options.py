"""The benchmark suite's own pytest options are typed where pytest reads them: a bad value is pytest's usage error
naming the option and what it takes, before any case runs (a negative count failed every case with a traceback,
`--bench-rounds 0` silently took the default, 100000 CPU threads crashed the process).

One run of pytest on the suite shows the wiring end to end; the options' values are drawn against the suite's own
option definitions read by pytest's parser in this process (a pytest start per value would cost seconds each)."""

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from benchmarks.suite import conftest as suite_conftest
from benchmarks.suite.shapes import SHAPE_SETS
from grpo_engine.resource_limits import usable_cpus
from repo_paths import ROOT

INT_MAX = 2**31 - 1


def test_a_bad_suite_option_ends_pytest_with_a_usage_error_naming_it():
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_XDIST_")}
    run = subprocess.run([sys.executable, "-m", "pytest", "benchmarks/suite/", "--bench-rounds=0", "-q", "-p",
                          "no:cacheprovider", "--collect-only"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=env)
    errors = [line for line in run.stderr.splitlines() if "error:" in line]
    assert run.returncode == 4 and len(errors) == 1, run.stdout[-2000:] + run.stderr[-2000:]
    assert "argument --bench-rounds: expected an integer from 1 to" in errors[0]
    assert "Traceback" not in run.stderr + run.stdout


def _parse(argument: str):
    parser = pytest.Parser(_ispytest=True)  # pytest's own parser of command lines
    suite_conftest.pytest_addoption(parser)
    return parser.parse([argument])


def _refusal(argument: str) -> str:
    with pytest.raises(pytest.UsageError) as refused:
        _parse(argument)
    errors = [line for line in str(refused.value).splitlines() if "error:" in line]
    assert len(errors) == 1, str(refused.value)
    return errors[0]


def _as_int(value) -> "int | None":
    """The integer a value reads as, as Python's int() reads a command-line string (surrounding blanks allowed)."""
    try:
        return int(value)
    except ValueError:
        return None


COUNTS = {"--bench-rounds": (1, "expected an integer from 1 to"), "--bench-warmup": (0, "expected an integer from 0 to"),
          "--bench-cpu-threads": (1, "expected a thread count")}


@settings(max_examples=40, deadline=None)
@given(option=st.sampled_from(sorted(COUNTS)),
       value=st.one_of(st.integers(-2**40, 2**40), st.sampled_from(["", "x", "1.5", "1e3", "nan", "0x10", " 2"])))
def test_every_count_option_takes_its_range_or_is_one_usage_error_naming_it(option, value):
    low, expected = COUNTS[option]
    high = usable_cpus() if option == "--bench-cpu-threads" else INT_MAX
    argument = f"{option}={value}"
    number = _as_int(value)
    if number is not None and low <= number <= high:
        assert getattr(_parse(argument), option[2:].replace("-", "_")) == number
    else:
        error = _refusal(argument)
        assert f"argument {option}:" in error and (expected in error or "integer" in error), error


@settings(max_examples=20, deadline=None)
@given(value=st.text(max_size=8))
def test_the_shape_set_is_one_of_its_names_or_a_usage_error_naming_it(value):
    if value in (*SHAPE_SETS, "auto"):
        assert _parse(f"--bench-set={value}").bench_set == value
    else:
        assert "argument --bench-set: invalid choice" in _refusal(f"--bench-set={value}")
