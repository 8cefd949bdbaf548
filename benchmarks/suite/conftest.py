"""pytest wiring of the suite: options, the shape parametrisation, case ordering and run metadata."""

from __future__ import annotations

import os
import platform
import shlex
import sys

import pytest
import torch

from grpo_engine.cli_types import bounded_int, positive_int, thread_count_type

from .interpreter_tiles import use_suite_tiles
from .machine import cpu_name, package_version
from .runner import BenchRunner
from .shapes import SHAPE_SETS, shape_set

_DEFAULT_ROUNDS = {"cpu": 5, "cuda": 20}
_DEFAULT_WARMUP = {"cpu": 1, "cuda": 3}
_skipped: list[dict] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("grpo-bench", "GRPO loss benchmarks")
    # each option typed where pytest reads it (grpo_engine.cli_types): a bad value is pytest's usage error naming
    # the option, before any case runs (a negative count failed every case with a traceback, 0 rounds silently took
    # the default, 100000 threads crashed the process)
    group.addoption("--bench-set", default="auto", choices=[*SHAPE_SETS, "auto"],
                    help="shape set: smoke, cpu, gpu or auto (gpu if CUDA, else cpu)")
    group.addoption("--bench-rounds", type=positive_int, default=None,
                    help="timed rounds per case (default 5 CPU, 20 GPU)")
    group.addoption("--bench-warmup", type=bounded_int(0), default=None,
                    help="untimed rounds first (default 1 CPU, 3 GPU)")
    group.addoption("--bench-no-memory", action="store_true", help="skip the peak-memory measurement")
    group.addoption("--bench-cpu-threads", type=thread_count_type(), default=1,
                    help="torch threads for CPU runs (default 1: on a shared machine, multi-threaded steps stall "
                         "at OpenMP barriers whenever another process takes a core, and timings scatter tenfold)")


def pytest_configure(config: pytest.Config) -> None:
    use_suite_tiles()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "shape" in metafunc.fixturenames:
        shapes = shape_set(metafunc.config.getoption("--bench-set"))
        metafunc.parametrize("shape", shapes, ids=[s.id for s in shapes])


def _input_order(item: pytest.Item) -> tuple:
    # Cases sharing (shape, regime) run back to back, so the inputs are built once per pair.
    params = getattr(item, "callspec", None)
    params = params.params if params else {}
    shape = params.get("shape")
    return (shape.head.name, shape.tokens) if shape else ("", 0), params.get("regime", "")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_input_order)  # stable: within a pair the file order is kept


def bench_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="session")
def runner(request: pytest.FixtureRequest):
    device = bench_device()
    if request.config.getoption("--bench-set") == "gpu" and device.type != "cuda":
        pytest.skip("the gpu shape set needs a CUDA device")
    if device.type == "cpu":
        torch.set_num_threads(request.config.getoption("--bench-cpu-threads"))
    rounds = request.config.getoption("--bench-rounds") or _DEFAULT_ROUNDS[device.type]
    warmup = request.config.getoption("--bench-warmup")
    bench_runner = BenchRunner(device, rounds, _DEFAULT_WARMUP[device.type] if warmup is None else warmup,
                               measure_memory=not request.config.getoption("--bench-no-memory"))
    yield bench_runner
    bench_runner.close()


def command_line() -> str:
    """How this pytest was started, as a person would type it."""
    program = sys.argv[0].rsplit("/", 1)[-1]
    if program == "__main__.py":  # python -m pytest
        program = "python -m pytest"
    return " ".join([program, *(shlex.quote(arg) for arg in sys.argv[1:])])


def run_metadata(config: pytest.Config) -> dict:
    device = bench_device()
    return {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else cpu_name(),
        "device_type": device.type,
        "cpu": cpu_name(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "triton": package_version("triton"),
        "cuda": torch.version.cuda,
        "liger_kernel": package_version("liger-kernel"),
        "cut_cross_entropy": package_version("cut-cross-entropy"),
        "trl": package_version("trl"),
        "grpo_kernels": package_version("grpo-kernels") or "source tree",
        "python": platform.python_version(),
        "bench_set": config.getoption("--bench-set"),
        "command_line": command_line(),
        # Other processes on the machine slow every timing down; the load says how busy it was.
        "load_average_1_5_15m": [round(x, 2) for x in os.getloadavg()],
    }


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    machine_info["grpo_bench"] = run_metadata(config)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and isinstance(report.longrepr, tuple):
        _skipped.append({"nodeid": report.nodeid, "reason": str(report.longrepr[2]).removeprefix("Skipped: ")})


def pytest_benchmark_update_json(config: pytest.Config, benchmarks: list, output_json: dict) -> None:
    # pytest-benchmark leaves skipped cases out of its JSON; keep them, with why, for the report.
    output_json["skipped"] = list(_skipped)
