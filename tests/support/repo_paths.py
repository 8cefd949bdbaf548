"""Where the repository and the test support files are, for tests that start processes or read committed files."""

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent  # tests/support: helpers, workers, user reward functions
ROOT = SUPPORT.parents[1]  # the repository root
