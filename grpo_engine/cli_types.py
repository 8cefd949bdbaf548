"""The value types of the command-line options that are not config keys (eval's --batch-size, bench's sizes,
serve's --port): each checks its range where argparse reads the value, so a bad one is the parser's one-line error
naming the flag, before any work. (Config keys are typed by the schema instead: grpo_engine/config/schema.py.)

argparse's plain `int` took `--batch-size 0` and `-3`, and eval then ran on with a batch of one; `float` took
`--budget-gb nan`, which failed later as "cannot convert float NaN to integer", naming nothing.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable, Optional

# The largest count any option takes: what a C int holds, the narrowest integer the libraries below take.
MAX_COUNT = 2**31 - 1


def bounded_int(low: int, high: int = MAX_COUNT, what: str = "an integer") -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} from {low} to {high:,}, got {text[:40]!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {what} from {low} to {high:,}, got {value}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its own messages
    return parse


def positive_float(what: str = "a number", high: Optional[float] = None) -> Callable[[str], float]:
    """An argparse type: a finite number > 0 (and <= high when given)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} > 0, got {text[:40]!r}") from None
        if not math.isfinite(value) or value <= 0 or (high is not None and value > high):
            limit = f" and at most {high:g}" if high is not None else ""
            raise argparse.ArgumentTypeError(f"expected {what}, a finite number > 0{limit}, got {text[:40]!r}")
        return value

    parse.__name__ = "number"
    return parse


positive_int = bounded_int(1)
port_number = bounded_int(1, 65535, "a port number")
