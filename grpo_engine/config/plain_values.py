"""A setting's value as a Python caller may hold it (a Path, a numpy or torch scalar, a tuple), as the flags give it:
the schema is strict about types, and these are the same values in another dress."""

from __future__ import annotations

import os
from typing import Any


def plain_value(value: Any) -> Any:
    """`value` as the flags would give it: a path as its text, a numpy or torch scalar as the Python number (or
    bool) it holds, a tuple or a one-dimensional array as a list. Anything else is left for the schema to judge,
    so a bool for a number, a set or a bytes path is still refused there by name."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, tuple):
        return [plain_value(item) for item in value]
    # numpy and torch are not imported here (this module is read by `--help`): their scalars and arrays by shape
    if type(value).__module__.split(".")[0] in ("numpy", "torch") and hasattr(value, "tolist"):
        ndim = getattr(value, "ndim", None)
        if ndim == 0:
            return value.item()
        if ndim == 1:
            return [plain_value(item) for item in value.tolist()]
    return value
