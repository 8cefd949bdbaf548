"""ConfigError, and the one line a pydantic ValidationError becomes: the key, the value, what was expected."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError


class ConfigError(ValueError):
    """A configuration problem, in one line that names the offending key."""


def section_model(model: type[BaseModel], path: tuple) -> tuple[str, type[BaseModel] | None]:
    """The dotted key of a pydantic error location, and the model class it ends in (None past a leaf).

    Locations also hold a union member's name ('list[str]') and list indices: the former is not part of the
    key the user wrote, the latter is shown as [i]."""
    key, current = "", model
    for part in path:
        if isinstance(part, int):
            key = f"{key}[{part}]"
        elif current is not None:
            key = f"{key}.{part}" if key else str(part)
            field = current.model_fields.get(part)
            annotation = field.annotation if field is not None else None
            current = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return key, current


def unknown_key_message(model: type[BaseModel], path: tuple, moved: dict[str, str]) -> str:
    """`unknown key 'run.max_stepz' (did you mean run.max_steps?)`, or where a shared setting lives."""
    parent_key, parent = section_model(model, path[:-1])
    name = str(path[-1])
    dotted = f"{parent_key}.{name}" if parent_key else name
    if dotted in moved:
        return f"unknown key {dotted!r}: {moved[dotted]}"
    placed = _elsewhere_in_tree(model, parent_key, name)
    if placed:
        return f"unknown key {dotted!r}: {placed}"
    valid = list(parent.model_fields) if parent is not None else []
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    if close:
        nearest = f"{parent_key}.{close[0]}" if parent_key else close[0]
        return f"unknown key {dotted!r} (did you mean {nearest}?)"
    return f"unknown key {dotted!r} (valid keys{' of ' + parent_key if parent_key else ''}: {', '.join(valid)})"


def _keys_of(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of the tree under `model`, its sections' included."""
    keys: list[str] = []
    for name, field in model.model_fields.items():
        keys.append(f"{prefix}{name}")
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys.extend(_keys_of(field.annotation, f"{prefix}{name}."))
    return keys


def _nested(dotted: str) -> str:
    parts = dotted.split(".")
    return "".join(f"{part}: {{" for part in parts[:-1]) + f"{parts[-1]}: ..." + "}" * (len(parts) - 1)


def _elsewhere_in_tree(model: type[BaseModel], parent_key: str, name: str) -> str | None:
    """Where a key written at the wrong place of a config file's tree belongs, or None: a flag's dotted name
    (`run.max_steps: 3`, `--run.max_steps: 3`) where the file nests (`run: {max_steps: 3}`), or a section's key
    outside its section (`max_steps: 3` at the top). Said as "unknown key 'run.max_steps'" with the sections'
    names beside it, the key the user wrote looked valid: it is the name --help lists."""
    keys = _keys_of(model)
    written = name.lstrip("-")
    full = f"{parent_key}.{written}" if parent_key else written
    target = full if full in keys else written if written in keys else None
    if "." in written and target is not None:
        return (f"a config file nests its keys ({_nested(target)}); the dotted name is the flag's (--{target}), not "
                f"read inside a file")
    homes = [key for key in keys if key.rsplit(".", 1)[-1] == written and key != full]
    if homes and "." not in written:
        sections = " and of ".join(key.rsplit(".", 1)[0] if "." in key else "the top level" for key in homes[:3])
        return (f"{written} is a key of {sections}, not of {parent_key or 'the top level'}: write it there "
                f"({_nested(homes[0])})")
    return None


# What a pydantic error type expected, in the words of this project's messages.
_EXPECTED = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
    "bool_type": "true or false", "bool_parsing": "true or false", "string_type": "a string",
    "list_type": "a list", "dict_type": "a mapping", "model_type": "a mapping of keys",
    "model_attributes_type": "a mapping of keys", "missing": "a value",
}
_BOUNDS = {"greater_than": (">", "gt"), "greater_than_equal": (">=", "ge"), "less_than": ("<", "lt"),
           "less_than_equal": ("<=", "le")}


def _expected(error: dict) -> str:
    """What the field expected, without the word 'expected' (a rule's own sentence when it is not one)."""
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind in _EXPECTED:
        return _EXPECTED[kind]
    if kind in _BOUNDS:
        sign, name = _BOUNDS[kind]
        return f"a value {sign} {ctx[name]}"
    if kind == "literal_error":
        return f"one of {ctx['expected']}"
    if kind == "too_short":
        return f"at least {ctx['min_length']} item{'s' if ctx['min_length'] != 1 else ''}"
    message = error["msg"].removeprefix("Value error, ").removeprefix("Input should be ")
    return message.removeprefix("expected ")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def describe(exc: ValidationError, model: type[BaseModel], moved: dict[str, str], at: tuple = ()) -> str:
    """One line for the first problem of `exc` (a union's alternatives are joined: 'expected a string or ...');
    `at`: where in `model` the validated section sits (an assignment to one section's key)."""
    errors = [{**error, "loc": (*at, *error["loc"])} for error in exc.errors(include_url=False)]
    first = errors[0]
    path = tuple(first["loc"])
    if first["type"] == "extra_forbidden":
        return unknown_key_message(model, path, moved)
    key, section = section_model(model, path)
    if first["type"] == "value_error" and (section is not None or not path):
        return _expected(first)  # a rule across the fields of a section: its sentence names the keys
    alternatives: list[str] = []
    for error in errors:
        if section_model(model, tuple(error["loc"]))[0] == key and _expected(error) not in alternatives:
            alternatives.append(_expected(error))
    value = "" if first["type"] == "missing" else f", got {_shown(first['input'])}"
    if first["type"] == "string_type" and isinstance(first["input"], (int, float)):
        # YAML read the text as a number or true / false (a commit `revision: 1234567`, `split: 2024`)
        value += " (YAML reads it as a number or true / false: quote it, '...', if it is text)"
    return f"{key or 'config'}: expected {' or '.join(alternatives)}{value}"
