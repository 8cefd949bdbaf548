"""One command for a device's full run: the suite, then the report, named after the device.

    python -m benchmarks.suite.run                 # CPU set on a CPU-only machine, GPU set where CUDA is
    python -m benchmarks.suite.run --set smoke -- -k loss   # extra pytest arguments after --

Writes benchmarks/results/<device>.json (pytest-benchmark), <device>.md and <device>-plots/*.png, where
<device> is e.g. cpu-amd-epyc or h100-80gb-hbm3.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import torch

from grpo_engine.cli_parser import CommandParser, doc_summary
from grpo_engine.cli_types import file_name
from grpo_engine.command_failure import run_tool

from . import report
from .machine import cpu_name
from .shapes import SHAPE_SETS
BENCHMARKS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(BENCHMARKS_DIR, "results")
SUITE_DIR = "benchmarks/suite/"


def device_slug() -> str:
    """cpu-<cpu model> or the GPU's name without the vendor, lower case, dashes."""
    if torch.cuda.is_available():
        name = re.sub(r"^nvidia\s+", "", torch.cuda.get_device_name(0).strip(), flags=re.IGNORECASE)
    else:
        name = "cpu " + re.sub(r"\s*\d+-core processor.*$", "", cpu_name(), flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m benchmarks.suite.run", description=doc_summary(__doc__, first_line=True))
    parser.add_argument("--set", default="auto", choices=["auto", *SHAPE_SETS],
                        help="shape set (default auto: gpu with CUDA, else cpu)")
    parser.add_argument("--name", type=file_name, help="results file name (default: the device slug)")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    name = args.name or device_slug()
    os.makedirs(RESULTS_DIR, exist_ok=True)
    repo_root = os.path.dirname(BENCHMARKS_DIR)
    # Relative to the repository root: these paths end up in the committed JSON and markdown.
    json_path = os.path.relpath(os.path.join(RESULTS_DIR, name + ".json"), repo_root)
    command = [sys.executable, "-m", "pytest", SUITE_DIR, "--benchmark-only", f"--bench-set={args.set}",
               f"--benchmark-json={json_path}", "-p", "no:cacheprovider", "-rs", *args.pytest_args]
    print("+", " ".join(command), flush=True)
    code = subprocess.call(command, cwd=repo_root)
    if code != 0:
        return code
    os.chdir(repo_root)
    return report.main([json_path, "--out", os.path.splitext(json_path)[0] + ".md"])


if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m benchmarks.suite.run"))
