"""How many processes pytest runs tests in. pyproject.toml's addopts pass `-n auto` (pytest-xdist); this decides
what `auto` means for any pytest run in this repository (the tests, the benchmark suite, the GPU checks):

- one worker per CPU this process may use, on a machine without CUDA (the tests there are CPU-bound and
  single-threaded for the most part: the Triton interpreter, small torch ops; tests/conftest.py gives each worker
  its share of torch's threads);
- none, i.e. the tests run in this one process as without xdist: on a machine with CUDA (the GPU tests time and
  measure memory on the one device, and assume nothing else is running on it), for the benchmark suite under
  benchmarks/ (its timings need the machine to themselves, and pytest-benchmark turns itself off under xdist),
  for `--collect-only` (starting workers costs more than collecting here), and for a pytest that a test of an xdist
  run starts (the run's workers already have every core).

PYTEST_XDIST_AUTO_NUM_WORKERS, when set, decides instead (xdist's own rule); `-n 0` (or `-n N`) on the command line
replaces `auto`.
"""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def pytest_xdist_auto_num_workers(config):
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    if config.option.collectonly or _runs_the_benchmark_suite(config) or os.environ.get("PYTEST_XDIST_WORKER"):
        return 0
    import torch

    if torch.cuda.is_available():
        return 0
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _runs_the_benchmark_suite(config) -> bool:
    benchmarks = ROOT / "benchmarks"
    for arg in config.args:
        path = (Path(config.invocation_params.dir) / arg.split("::")[0]).resolve()
        if path == benchmarks or benchmarks in path.parents:
            return True
    return False


def pytest_cmdline_main(config):
    # After xdist's own (tryfirst) has set the distribution mode. pytest-benchmark turns itself off in an xdist run
    # with a warning from every process; what runs under xdist here is the tests, none of them a benchmark (the
    # benchmark suite runs in one process, above), so it is turned off without one.
    if config.getoption("dist", "no") != "no" and not config.getoption("benchmark_only", False):
        config.option.benchmark_disable = True
