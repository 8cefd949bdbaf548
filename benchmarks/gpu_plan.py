"""`python -m benchmarks.gpu_plan`, the command the issues and docs name: the modelled parts of a first GPU run,
printed by benchmarks/gpu/plan.py (same arguments)."""

import sys

from .gpu.plan import main
from grpo_engine.command_failure import run_tool

if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m benchmarks.gpu_plan"))
