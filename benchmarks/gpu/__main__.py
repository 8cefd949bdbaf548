"""`python -m benchmarks.gpu` runs the GPU command (benchmarks/gpu/command.py)."""

import sys

from grpo_engine.command_failure import run_tool

from .command import main

sys.exit(run_tool(main, "python -m benchmarks.gpu"))
