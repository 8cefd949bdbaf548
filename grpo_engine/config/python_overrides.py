"""load_config's `overrides` and `path` as a Python caller writes them (a notebook, a script), turned into what the
flags give: dotted keys and plain values.

A caller writes `{"run.max_steps": np.int64(10)}`, `{"run.output_dir": Path(...)}`, `{"rewards.functions": (...)}` or
`{"run": {"max_steps": 10}}`. Before, a numpy integer was "expected an integer, got np.int64(10)" (a numpy float was
taken), a Path and a tuple were refused, a key that is not text (`{("run", "max_steps"): 10}`) or overrides that are
not a mapping (`["run.max_steps=10"]`) stopped in an AttributeError naming nothing, and a section given as a mapping
replaced the whole section: its YAML keys, and a dotted key given beside it (`{"run.seed": 5, "run": {...}}`), were
dropped without a word (the run wrote into the default run directory).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Iterator, Optional

from pydantic import BaseModel

from .errors import ConfigError
from .plain_values import plain_value
from .schema import EngineConfig

_EXAMPLE = "{'run.max_steps': 10}"


def _section_at(dotted: str) -> Optional[type[BaseModel]]:
    """The schema's section a dotted key names (`run`, `model.lora`), or None for a leaf or an unknown key."""
    current: Optional[type[BaseModel]] = EngineConfig
    for part in dotted.split("."):
        field = current.model_fields.get(part) if current is not None else None
        annotation = field.annotation if field is not None else None
        current = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return current


def _key(key: Any, inside: str) -> str:
    if not isinstance(key, str):
        where = f" inside {inside!r}" if inside else ""
        raise ConfigError(f"overrides: expected each key to be text, a dotted key such as 'run.max_steps', got "
                          f"{key!r} ({type(key).__name__}){where}")
    return f"{inside}.{key}" if inside else key


def _leaves(dotted: str, value: Any) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of each setting `value` gives: a mapping given for a section sets the keys it holds."""
    if isinstance(value, Mapping) and _section_at(dotted) is not None:
        for key, item in value.items():
            yield from _leaves(_key(key, dotted), item)
    else:
        yield dotted, plain_value(value)


def dotted_overrides(overrides: Any) -> dict[str, Any]:
    """`overrides` as dotted keys and plain values; a setting given twice with two values (`run.seed` and `run:
    {seed: ...}`) is refused, naming both."""
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"overrides: expected a mapping of dotted keys to values, such as {_EXAMPLE}, got "
                          f"{type(overrides).__name__}")
    flat: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    for key, value in overrides.items():
        for dotted, leaf in _leaves(_key(key, ""), value):
            if dotted in flat and flat[dotted] != leaf:
                raise ConfigError(f"overrides: {dotted} given twice, {flat[dotted]!r} (in {given_as[dotted]!r}) and "
                                  f"{leaf!r} (in {key!r}): give it once")
            flat[dotted], given_as[dotted] = leaf, key
    return flat


def config_path(path: Any) -> Optional[str]:
    """load_config's `path` as text: a str, an os.PathLike or bytes (the file system's encoding)."""
    if path is None or isinstance(path, str):
        return path
    if isinstance(path, (bytes, os.PathLike)):
        return os.fsdecode(path)
    raise ConfigError(f"config file: expected a path (str or {Path.__name__}), got {type(path).__name__} {path!r}")
