"""`python -m benchmarks.roofline`, the command the issues and docs name: the roofline model's tables, printed by
benchmarks/model/roofline.py (same arguments)."""

import sys

from .model.roofline import main

if __name__ == "__main__":
    sys.exit(main())
