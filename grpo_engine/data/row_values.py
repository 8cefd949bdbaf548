"""What a dataset row may hold, whatever file format it came from: the values of JSON (text, finite numbers,
true / false, null, lists, objects with text keys); nothing else (Parquet's bytes, dates, times and decimals reached
reward functions as the Python objects pyarrow gives, which a reward written for JSON's values does not expect). Checked once, when the rows load, so that no reader (the
prompt renderer, a reward function, the checkpoint's data fingerprint) meets a value it would take silently for
another: a NaN answer that math_accuracy scores as "wrong", an infinity from `1e400`, a lone UTF-16 surrogate
(`"\\ud800"`, valid JSON but not Unicode) that the tokenizer refuses deep inside, or that no file can be written with.

The JSON readers refuse what the standard does not allow (NaN, Infinity), and numbers Python cannot hold, with the
file and line (`strict_json_hooks`); `check_row_values` then covers every format (Parquet's NaN floats, a datasets
directory) with the row and column.
"""

from __future__ import annotations

import math
import unicodedata
from numbers import Integral, Real
from typing import Any, Callable, Iterable, Optional

from .chat_messages import shows

# Python reads integers of at most this many digits (sys.get_int_max_str_digits' default); past it json raises a
# ValueError that names no file.
MAX_INT_DIGITS = 4300


class RowValueError(ValueError):
    """A value a dataset row may not hold: one line naming where it is."""


def _refuse_constant(name: str) -> Any:
    raise RowValueError(f"{name} is not JSON (the standard has no NaN or Infinity); write null for a missing value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise RowValueError(f"the number {text[:40]} is past the largest float (about 1.8e308)")
    return value


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise RowValueError(f"an integer of {digits:,} digits, more than the {MAX_INT_DIGITS:,} Python reads; "
                            f"write it as a string")
    return int(text)


def strict_json_hooks() -> dict[str, Callable[[str], Any]]:
    """json.loads' hooks that refuse NaN / Infinity / -Infinity, floats that overflow to infinity and integers too
    long to read, each as a RowValueError the caller prefixes with the file and line."""
    return {"parse_constant": _refuse_constant, "parse_float": _finite_float, "parse_int": _bounded_int}


def unencodable(text: str) -> Optional[str]:
    """Why `text` is not encodable Unicode (a lone surrogate, where), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"a lone UTF-16 surrogate U+{ord(text[exc.start]):04X} at character {exc.start} (not Unicode text)"
    return None


def _finite(number: Real) -> bool:
    """An integer is finite at any length JSON reads (one of 309 to 4,300 digits made float() raise OverflowError:
    a traceback); any other real number when it converts to a finite float."""
    if isinstance(number, Integral):
        return True
    try:
        return math.isfinite(float(number))
    except OverflowError:  # a Fraction or another Real past the largest float
        return False


def value_problem(value: Any) -> Optional[str]:
    """What is wrong with `value` (anything inside it, walked without recursion), or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            problem = unencodable(item)
            if problem:
                return f"holds {problem}"
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, Real):
            if not _finite(item):
                return f"holds {str(item)[:40]}, not a finite number (write null for a missing value)"
        elif isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    return f"holds an object key {key!r:.40} that is not text"
                problem = unencodable(key)
                if problem:
                    return f"holds an object key with {problem}"
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        else:  # Parquet's bytes, dates, times and decimals; any other object a datasets directory holds
            kind = type(item)
            name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
            return (f"holds a {name} value ({str(item)[:40]}), not one of JSON's (text, a number, true / false, null, "
                    f"a list, an object): store that column as text or numbers")
    return None


def check_row_values(rows: list[dict[str, Any]], source: str) -> None:
    """Every row's column names and values are JSON's: RowValueError naming the first row and column that is not."""
    for i, row in enumerate(rows):
        for column, value in row.items():
            problem = value_problem({column: value})
            if problem:
                raise RowValueError(f"dataset {source!r} row {i} column {str(column)[:60]!r} {problem}; fix or drop "
                                    f"that row")


def shown_name(column: str) -> str:
    """How a column name reads on screen: its NFKC form (U+00E9 and e + U+0301, fullwidth letters) without
    characters that show nothing (U+200B, U+FEFF) and without spaces at either end."""
    return "".join(c for c in unicodedata.normalize("NFKC", column) if shows(c) or c.isspace()).strip()


def check_column_names(rows: list[dict[str, Any]], source: str) -> None:
    """No two column names that read the same (`é` as U+00E9 in some rows, as e + U+0301 in others, as editors and
    platforms write it; `answer` and `answer ` or `ans\u200bwer`): they look the same in every message, and a reward
    function reading one met rows without it, or the prompt of one row was another's column. RowValueError
    naming both, with the rows they are first in."""
    first_row: dict[str, int] = {}
    by_form: dict[str, str] = {}
    for i, row in enumerate(rows):
        for column in row:
            if column in first_row:
                continue
            first_row[column] = i
            other = by_form.setdefault(shown_name(column), column)
            if other != column:
                raise RowValueError(
                    f"dataset {source!r}: the columns {other!r} (row {first_row[other]}) and {column!r} (row {i}) read "
                    f"as the same name, in other Unicode normalizations or with invisible characters or spaces "
                    f"({_code_points(other)} and {_code_points(column)}); write the name one way (NFC, nothing around "
                    f"it)")


def lookalike_note(name: str, columns: Iterable[str]) -> str:
    """For a column name a setting gives that the rows lack: a note naming the column they hold that reads the same
    (NFC in the config, NFD in the file; `prompt` and `\ufeffprompt` from a spreadsheet's export; `prompt `), with
    both names' code points; "" when none does. The bare message listed the columns, one looking exactly like the
    one said missing."""
    other = next((column for column in columns if column != name and shown_name(column) == shown_name(name)), None)
    if other is None:
        return ""
    return (f" (the column {other!r} reads the same, written differently: {_code_points(other)} against "
            f"{_code_points(name)}; write the name one way)")


def _code_points(text: str, limit: int = 12) -> str:
    shown = " ".join(f"U+{ord(c):04X}" for c in text[:limit] if not c.isascii() or c.isspace())
    return shown or "ASCII"
