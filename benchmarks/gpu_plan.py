"""`python -m benchmarks.gpu_plan`, the command the issues and docs name: the modelled parts of a first GPU run,
printed by benchmarks/gpu/plan.py (same arguments)."""

import sys

from .gpu.plan import main

if __name__ == "__main__":
    sys.exit(main())
