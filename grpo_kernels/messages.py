"""How a caller's value appears in an error message: on one short line, whatever the value."""

from __future__ import annotations

import math

SHOWN_CHARACTERS = 60


def shown(value: object) -> str:
    """`value` as an error message quotes it: an array or tensor of more than one element by its type, dtype and
    shape (its repr would print the elements over many lines), anything else by its repr on one line, cut at
    SHOWN_CHARACTERS."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None and not isinstance(value, (str, bytes)):
        try:
            dims = [int(d) for d in shape]
        except (TypeError, ValueError):
            dims = None
        if dims is not None and math.prod(dims) != 1:
            return f"{type(value).__name__} of dtype {str(dtype).removeprefix('torch.')} and shape {dims}"
    try:
        text = " ".join(repr(value).split())
    except Exception:  # a repr that fails must not hide the message it was to be part of
        text = f"<{type(value).__name__}>" if dtype is None else \
            f"<{type(value).__name__} of dtype {str(dtype).removeprefix('torch.')}>"
    return text if len(text) <= SHOWN_CHARACTERS else text[:SHOWN_CHARACTERS - 3] + "..."
