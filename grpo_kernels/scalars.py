"""Scalars as a caller may hold them, read as the builtin float / int the library stores and computes with.

A setting's number often comes from numpy (np.float32(0.2) from a sweep, np.int64 from an array), from
fractions.Fraction or decimal.Decimal: each is a real number, and was refused as "not a finite number" by some
settings (GRPOLossConfig's) and taken by others (LogitTransform's). One rule for every scalar setting: a real
number of any of these types is read as a builtin float (an integer one as an int where an int is declared);
bool, text, tensors and arrays are not numbers here (True is not 1.0; a one-element tensor would sync a device)."""

from __future__ import annotations

import decimal
import math
import numbers
from typing import Optional


def real_value(value: object) -> Optional[float]:
    """`value` as a builtin float (possibly inf or NaN: the caller checks bounds), or None when it is no real
    number."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, decimal.Decimal)):  # numpy's bool_ is no Real
        return None
    try:
        return float(value)
    except OverflowError:  # an int or Fraction beyond float's range: an infinity, refused by the finite check
        return math.copysign(math.inf, value)  # type: ignore[arg-type]
    except (TypeError, ValueError, decimal.InvalidOperation):
        return None


def finite_real(value: object) -> Optional[float]:
    """`value` as a finite builtin float, or None."""
    real = real_value(value)
    return real if real is not None and math.isfinite(real) else None


def integer_value(value: object) -> Optional[int]:
    """`value` as a builtin int when it is an integer type (int, numpy's integers), else None: a float, even a
    whole one, is not taken where a count or a length is declared."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def require_bool(name: str, value: object) -> bool:
    """A switch: True or False only (bool("False") is True, so text or a number here would turn it on)."""
    if not isinstance(value, bool):
        from .messages import shown

        raise TypeError(f"{name} must be True or False, got {shown(value)}")
    return value


def same_value(value: object, builtin: object) -> object:
    """The value to store: the caller's own object when it already is a builtin int or float (kept as given, so
    beta=0 stays 0), else its builtin reading."""
    return value if type(value) in (int, float) else builtin
