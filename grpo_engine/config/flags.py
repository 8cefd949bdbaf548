"""The command line's view of the schema: one `--section.key VALUE` flag per leaf key, its value read as the
type of the field it sets, and its help line (meaning and default) from the field's description."""

from __future__ import annotations

import json
from typing import Any, Optional

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from grpo_kernels.losses import loss_param_aliases

from .schema import SHARED_SETTINGS, EngineConfig
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



def home_of(key: str) -> Optional[str]:
    """Where the setting a flag `--key` means lives, for a `key` that is no flag but names a setting the schema holds
    another way, in words naming that flag; None for any other key. The difflib guess for these led elsewhere:
    `--loss.max_completion_length` to --data.max_prompt_length, `--loss.sapo_temperature_pos` and
    `--loss.params.temperature_pos` (the name the refusals of loss.params use) to --rollout.temperature."""
    if key in SHARED_SETTINGS:  # held once, by the rollout's key (the YAML loader says the same)
        return SHARED_SETTINGS[key]
    section, _, name = key.partition(".")
    aliases = loss_param_aliases()
    if section == "loss" and name in aliases:  # TRL's name of a loss type's own hyper-parameter
        owner, param = aliases[name]
        return (f"TRL's {name} is loss.params.{param}, read with loss.loss_type {owner}: "
                f"--loss.params '{{{param}: VALUE}}'")
    mapping = next((leaf for leaf, field in leaf_fields().items() if key.startswith(f"{leaf}.")
                    and dict in value_kinds(field.annotation)), None)
    if mapping is not None:  # an entry of a key whose value is a mapping: that key's one flag sets them all
        entry = key[len(mapping) + 1:]
        return f"{mapping} is one flag taking a mapping: --{mapping} '{{{entry}: VALUE}}'"
    return None
