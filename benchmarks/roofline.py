"""`python -m benchmarks.roofline`, the command the issues and docs name: the roofline model's tables, printed by
benchmarks/model/roofline.py (same arguments)."""

import sys

from .model.roofline import main
from grpo_engine.command_failure import run_tool

if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m benchmarks.roofline"))
