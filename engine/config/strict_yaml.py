"""The YAML dialect of config files and of the saved config.yaml: strict, and the same both ways.

PyYAML's safe loader speaks YAML 1.1, where `yes` is a boolean, `1e-5` a string and a repeated key silently
keeps its last value. This dialect follows YAML 1.2's core schema for scalars (booleans are true / false,
`1e-5` is a number) and refuses a key given twice in one mapping, naming the line. Its dumper quotes every
string the loader would read as something else, so a saved config reads back equal.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution), in the order PyYAML tries them.
_CORE_SCALARS = (
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("tag:yaml.org,2002:int", r"^[-+]?[0-9]+$", "-+0123456789"),
    ("tag:yaml.org,2002:float",
     r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
     "-+.0123456789"),
)


def _use_core_scalars(cls: type) -> type:
    cls.yaml_implicit_resolvers = {}
    for tag, pattern, first in _CORE_SCALARS:
        cls.add_implicit_resolver(tag, re.compile(pattern), list(first))
    return cls


@_use_core_scalars
class StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice in one mapping (first on line {seen[key]})",
                    key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        return int(self.construct_scalar(node))  # decimal: YAML 1.1's leading-0 octal (017 = 15) is not read


StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)


@_use_core_scalars
class StrictDumper(yaml.SafeDumper):
    def represent_str(self, data: str) -> yaml.ScalarNode:
        # PyYAML writes NEL (U+0085) and the Unicode line and paragraph separators bare inside plain and single-
        # quoted scalars, where a reader takes them for line breaks; double quotes escape them (\N, \L, \P).
        if any(char in data for char in "\x85\u2028\u2029"):
            return self.represent_scalar("tag:yaml.org,2002:str", data, style='"')
        return super().represent_str(data)


StrictDumper.add_representer(str, StrictDumper.represent_str)


def parse_yaml(text: str, source: str) -> Any:
    """The value `text` holds; a syntax error or a repeated key is one line naming `source` and the line."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - StrictLoader is a SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = " ".join((exc.problem or exc.context or "invalid YAML").split())
        raise ConfigError(f"{source}{where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: {' '.join(str(exc).split())}") from None


def read_yaml(path: str | Path) -> dict:
    """A config file's mapping of sections."""
    path = Path(path)
    source = f"config file {str(path)!r}"
    if path.is_dir():
        raise ConfigError(f"{source} is a directory, not a YAML file")
    if not path.is_file():
        raise ConfigError(f"{source} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{source} line {line}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}); save it as "
                          "UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{source} cannot be read: {exc.strerror or exc}") from None
    data = parse_yaml(text, source)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections, got {type(data).__name__}")
    return data


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=StrictDumper, sort_keys=False, allow_unicode=True)
