"""`python -m grpo_engine` is `grpo-engine`."""

import sys

from .cli import main

sys.exit(main())
