"""The command line's view of the schema: one `--section.key VALUE` flag per leaf key, its value read as the
type of the field it sets, and its help line (meaning and default) from the field's description."""

from __future__ import annotations

import json
import types
import typing
from typing import Any, Annotated, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from .schema import EngineConfig
from .errors import ConfigError
from .strict_yaml import parse_yaml


def leaf_fields(model: type[BaseModel] = EngineConfig, prefix: str = "") -> dict[str, FieldInfo]:
    """Every dotted leaf key of the schema with its field: the CLI makes one flag per key."""
    leaves: dict[str, FieldInfo] = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            leaves.update(leaf_fields(annotation, f"{prefix}{name}."))
        else:
            leaves[f"{prefix}{name}"] = field
    return leaves


def leaf_keys() -> list[str]:
    return list(leaf_fields())


def _kinds(annotation: Any) -> set[type]:
    """The Python types a field's annotation admits at its top level (Annotated and Union unwrapped)."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _kinds(typing.get_args(annotation)[0])
    if origin is Literal:
        return {type(value) for value in typing.get_args(annotation)}
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_kinds(arg) for arg in typing.get_args(annotation)))
    if annotation is None or annotation is type(None):
        return {type(None)}
    return {origin or annotation}


def flag_value(key: str, text: str) -> Any:
    """The value `--key TEXT` sets, read as the field's type: a string field takes TEXT as written; `null`
    unsets a field that may be null; anything else (numbers, true/false, [lists], {mappings}) is read as the
    same value in the YAML file would be, then checked by the schema like it."""
    kinds = _kinds(leaf_fields()[key].annotation)
    if text == "null" and type(None) in kinds:
        return None
    if str in kinds and not (list in kinds and text.lstrip().startswith("[")):
        return text
    if str in kinds:  # a string-or-list field: text that reads as a YAML list is the list, else the string itself
        try:
            value = parse_yaml(text, f"--{key}")
        except ConfigError:
            return text
        return value if isinstance(value, list) else text
    value = parse_yaml(text, f"--{key}")
    if isinstance(value, list) and list not in kinds:
        return text  # `-` for a number: refused showing the text typed, not the YAML list it reads as ([None])
    return value


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def key_help() -> dict[str, str]:
    """{dotted key: "meaning (default: value)"} for every leaf key."""
    result = {}
    for key, field in leaf_fields().items():
        default = field.get_default(call_default_factory=True)
        meaning = field.description or ""
        result[key] = f"{meaning} (default: {_shown(default)})" if meaning else f"(default: {_shown(default)})"
    return result

