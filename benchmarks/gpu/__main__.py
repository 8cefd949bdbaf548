"""`python -m benchmarks.gpu` runs the GPU command (benchmarks/gpu/command.py)."""

import sys

from .command import main

sys.exit(main())
