"""When a setting is read: each field of the schema that is read only under another setting's choice declares that
condition next to itself (`Annotated[..., ReadWhen(...)]`, on a leaf or on a whole section), and the warning for a
setting that will not be read is derived from the declarations, never from a list kept apart.

Set away from its default where it is not read, such a setting would change nothing, silently: a server URL
with the local backend trains without the server, a LoRA rank without LoRA trains every weight, an evaluation
interval without evaluation data evaluates nothing. The run says so at its start (`grpo_engine/run_setup.py`), one
line per setting, naming what would make it apply. Not refused: a YAML file may carry a section for another
backend and still be right for this run.

Each condition also says which settings make it hold and which make it fail (`when_true`, `when_false`: dotted
overrides), so that its meaning can be checked by building those configs (tests/engine/config/test_applicability.py
walks every setting both ways).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from pydantic import BaseModel


def value_at(config: Any, key: str) -> Any:
    for part in key.split("."):
        config = getattr(config, part)
    return config


@dataclass(frozen=True)
class ReadWhen:
    """The condition under which the setting it annotates (or every setting of the section it annotates) is read.

    `text` says it as a user would set it; `holds(config)` evaluates it; `when_true` / `when_false` are overrides
    that make it hold / fail (on top of the schema's defaults)."""

    text: str
    holds: Callable[[Any], bool] = field(compare=False)
    when_true: Mapping[str, Any] = field(default_factory=dict, compare=False)
    when_false: Mapping[str, Any] = field(default_factory=dict, compare=False)


def read_when_is(key: str, value: Any, otherwise: Any) -> ReadWhen:
    """Read when the setting `key` is `value` (`otherwise` is another valid value of `key`)."""
    shown = str(value).lower() if isinstance(value, bool) else value
    return ReadWhen(f"{key} {shown}", lambda c: value_at(c, key) == value, {key: value}, {key: otherwise})


def read_when_listed(key: str, item: str, otherwise: str) -> ReadWhen:
    """Read when the list setting `key` holds `item`."""
    return ReadWhen(f"{item} in {key}", lambda c: item in value_at(c, key), {key: [item]}, {key: [otherwise]})


def read_when_positive(key: str) -> ReadWhen:
    return ReadWhen(f"{key} > 0", lambda c: value_at(c, key) > 0, {key: 1}, {key: 0})


def read_when_any(text: str, *conditions: ReadWhen) -> ReadWhen:
    """Read when one of `conditions` holds."""
    false = {key: value for condition in conditions for key, value in condition.when_false.items()}
    return ReadWhen(text, lambda c: any(condition.holds(c) for condition in conditions),
                    dict(conditions[0].when_true), false)


def conditions_of(field_info: Any) -> tuple[ReadWhen, ...]:
    return tuple(item for item in field_info.metadata if isinstance(item, ReadWhen))


def declared_conditions(model: type[BaseModel], prefix: str = "",
                        inherited: tuple[ReadWhen, ...] = ()) -> Iterator[tuple[str, tuple[ReadWhen, ...]]]:
    """(dotted leaf key, the conditions under which it is read: its own and its sections') for every leaf key."""
    for name, info in model.model_fields.items():
        conditions = inherited + conditions_of(info)
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from declared_conditions(annotation, f"{prefix}{name}.", conditions)
        else:
            yield f"{prefix}{name}", conditions


def inapplicable_settings(config: BaseModel, *defaults: BaseModel) -> list[str]:
    """One line per setting that differs from each of `defaults` (the schema's; with the run's preset too, where a
    preset may apply) where one of the conditions it declares does not hold."""
    notes = []
    for key, conditions in declared_conditions(type(config)):
        failing = next((condition for condition in conditions if not condition.holds(config)), None)
        value = value_at(config, key)
        if failing is not None and all(value != value_at(default, key) for default in defaults):
            shown = value.model_dump() if isinstance(value, BaseModel) else value
            notes.append(f"{key} is set ({shown!r}) but applies only with {failing.text}: it changes nothing in "
                         f"this run")
    return notes
