"""The benchmark suite's own pytest options are typed where pytest reads them: a bad value is pytest's usage error
naming the option and what it takes, before any case runs (a negative count failed every case with a traceback,
`--bench-rounds 0` silently took the default, 100000 CPU threads crashed the process)."""

import os
import subprocess
import sys

import pytest

from grpo_engine.resource_limits import usable_cpus
from repo_paths import ROOT


@pytest.mark.parametrize("option, expected", [
    ("--bench-rounds=0", "argument --bench-rounds: expected an integer from 1 to"),
    ("--bench-warmup=-2", "argument --bench-warmup: expected an integer from 0 to"),
    (f"--bench-cpu-threads={usable_cpus() + 1}", "argument --bench-cpu-threads: expected a thread count"),
    ("--bench-set=huge", "argument --bench-set: invalid choice: 'huge'"),
])
def test_a_bad_suite_option_is_a_usage_error_naming_it(option, expected):
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_XDIST_")}
    run = subprocess.run([sys.executable, "-m", "pytest", "benchmarks/suite/", option, "-q", "-p", "no:cacheprovider",
                          "--collect-only"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    errors = [line for line in run.stderr.splitlines() if "error:" in line]
    assert run.returncode == 4 and len(errors) == 1 and expected in errors[0], run.stdout[-2000:] + run.stderr[-2000:]
    assert "Traceback" not in run.stderr + run.stdout
