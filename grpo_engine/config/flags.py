"""The command line's view of the schema: one `--section.key VALUE` flag per leaf key, its value read as the
type of the field it sets, and its help line (meaning and default) from the field's description."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from .schema import EngineConfig
from .errors import ConfigError
from .strict_yaml import parse_yaml
from .value_kinds import value_kinds


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


def flag_value(key: str, text: str) -> Any:
    """The value `--key TEXT` sets, read as the field's type: a string field takes TEXT as written; `null`
    unsets a field that may be null; anything else (numbers, true/false, [lists], {mappings}) is read as the
    same value in the YAML file would be, then checked by the schema like it."""
    kinds = value_kinds(leaf_fields()[key].annotation)
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
    if not text.strip():  # `--run.max_steps ""`: null to YAML ("got None"), or a tab YAML refused as indentation
        return text
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

