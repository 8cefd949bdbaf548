"""The YAML dialect of config files and of the saved config.yaml: strict, and the same both ways.

PyYAML's safe loader speaks YAML 1.1, where `yes` is a boolean, `1e-5` a string and a repeated key silently
keeps its last value. This dialect follows YAML 1.2's core schema for scalars (booleans are true / false,
`1e-5` is a number) and refuses a key given twice in one mapping, naming the line. Its dumper quotes every
string the loader would read as something else, so a saved config reads back equal.
"""

from __future__ import annotations

import codecs
import re
import unicodedata
from pathlib import Path
from typing import Any

import yaml

from ..state.bounded_read import special_file_kind
from .errors import ConfigError
from .path_form import path_form_problem

# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution), in the order PyYAML tries them.
_CORE_SCALARS = (
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("tag:yaml.org,2002:int", r"^[-+]?[0-9]+$", "-+0123456789"),
    ("tag:yaml.org,2002:float",
     r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
     "-+.0123456789"),
)


_CORE_TAG = "tag:yaml.org,2002:"
# The tags a config's values may carry, written out (`!!int 3`) or implied: YAML 1.2's core schema. Any other
# (`!!python/object`, `!!binary`, `!!set`, `!!timestamp`, `!local`) built a value no setting takes (bytes, a set, a
# date) or was refused in PyYAML's words ("could not determine a constructor for the tag ...").
_SCALAR_PATTERNS = {tag: re.compile(pattern) for tag, pattern, _ in _CORE_SCALARS}
_CORE_TAGS = {*_SCALAR_PATTERNS, _CORE_TAG + "str", _CORE_TAG + "seq", _CORE_TAG + "map"}


def _shown_tag(tag: str) -> str:
    return "!!" + tag[len(_CORE_TAG):] if tag.startswith(_CORE_TAG) else tag


def _tag_problem(node: yaml.Node) -> str | None:
    """Why `node`'s tag cannot be read in a config, or None: a tag outside the core schema, or a core scalar tag on
    text that is not of its kind (`!!int x` raised a ValueError traceback, `!!null x` read None)."""
    if node.tag not in _CORE_TAGS:
        return (f"the tag {_shown_tag(node.tag)} is not read in config files (only plain values: text, numbers, "
                f"true / false, null, lists and mappings); remove it")
    pattern = _SCALAR_PATTERNS.get(node.tag)
    if pattern is not None and isinstance(node, yaml.ScalarNode) and not pattern.match(node.value):
        return (f"{node.value!r} is not a {_shown_tag(node.tag)} value (YAML 1.2's core schema); remove the tag or "
                f"fix the value")
    return None


# The lines a person counts in an editor (and `sed -n`, `grep -n`): broken by \n, \r\n or a lone \r. PyYAML also
# breaks lines at NEL (U+0085) and the Unicode line / paragraph separators, so its marks' line numbers ran ahead
# of the file's after one of those inside a value.
_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def _line(text: str, mark: yaml.Mark) -> int:
    """The 1-based line of `mark` in `text`, as an editor counts lines."""
    if mark.index is None:
        return mark.line + 1
    return len(_LINE_BREAK.findall(text, 0, mark.index)) + 1


def _use_core_scalars(cls: type) -> type:
    cls.yaml_implicit_resolvers = {}
    for tag, pattern, first in _CORE_SCALARS:
        cls.add_implicit_resolver(tag, re.compile(pattern), list(first))
    return cls


# A space YAML does not take for one (a no-break space, an ideographic space: pasted from a web page, a document or an
# input method) where the text's structure needs one: at the start of a plain value, which only indentation written
# with it can give (`\u3000 max_steps: 3` became a key of that name beside a `run:` of null, refused as "run: expected
# a mapping"), or right after the colon of a plain `key:` (`max_steps:\xa03` became the text of the section above).
_ODD_SPACE = "[\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000\ufeff]"
_MISPLACED_SPACE = re.compile(rf"^({_ODD_SPACE})|^[A-Za-z_][A-Za-z0-9_]*:({_ODD_SPACE})")  # a key: a setting's name


@_use_core_scalars
class StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                # Every key of a config is a name. A number, null or true there is a typo, and a list or mapping
                # (`? [a, b]`) is not even hashable: the check below failed on it with a TypeError traceback.
                shown = repr(key) if isinstance(key_node, yaml.ScalarNode) else f"a {type(key).__name__}"
                raise yaml.constructor.ConstructorError(
                    None, None, f"a key must be a name (text), got {shown}; quote it if it is one",
                    key_node.start_mark)
            if key == "<<" and isinstance(key_node, yaml.ScalarNode) and key_node.style is None:
                # YAML 1.1's merge key, which YAML 1.2 dropped: read as a key named '<<' it was "unknown key
                # 'run.<<'", which did not say why
                raise yaml.constructor.ConstructorError(
                    None, None, "a merge key (<<: *anchor) is not read in config files (YAML 1.2 has none); write "
                    "the keys out, or repeat the anchor's values", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"key {key!r} given twice in one mapping (first on line {_line(self.buffer, seen[key])})",
                    key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        return int(self.construct_scalar(node))  # decimal: YAML 1.1's leading-0 octal (017 = 15) is not read


StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)


@_use_core_scalars
class StrictDumper(yaml.SafeDumper):
    def represent_str(self, data: str) -> yaml.ScalarNode:
        # PyYAML writes NEL (U+0085) and the Unicode line and paragraph separators bare inside plain and single-
        # quoted scalars, where a reader takes them for line breaks; double quotes escape them (\N, \L, \P).
        # And text the reader refuses written plain (_MISPLACED_SPACE: it starts like a misplaced space) is quoted.
        if any(char in data for char in "\x85\u2028\u2029") or _MISPLACED_SPACE.search(data):
            return self.represent_scalar("tag:yaml.org,2002:str", data, style='"')
        return super().represent_str(data)


StrictDumper.add_representer(str, StrictDumper.represent_str)


# The reader's bounds: a config file (or a flag's value, or a saved config.yaml) holds a few hundred values in
# sections a few levels deep. Aliases can make a few hundred bytes stand for billions of values ("a billion
# laughs": PyYAML builds them as shared objects quickly, but whatever walks the result, the schema included, pays
# for every copy), so the values are counted as the aliases expand them before anything is built from them.
MAX_CONFIG_BYTES = 1 << 20
MAX_EXPANDED_VALUES = 100_000
MAX_NESTING = 32


def _check_node_bounds(root: yaml.Node, text: str, source: str) -> None:
    """Every value the node graph expands to is counted (an alias as often as it is used: once per node, by
    memoisation, so the count itself takes time linear in the text) and its depth measured; past a bound, an
    alias that contains itself, or a tag outside the core schema, one line naming `source` and the line."""
    sizes: dict[int, int] = {}
    depths: dict[int, int] = {}
    open_nodes: set[int] = set()
    # iterative post-order walk: a deep text must not overflow Python's own stack here
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children = [] if isinstance(node, yaml.ScalarNode) else (
            [part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode) else list(node.value))
        if not children_done:
            problem = _tag_problem(node)
            if problem:
                raise ConfigError(f"{source} line {_line(text, node.start_mark)}: {problem}")
            if key in open_nodes:
                raise ConfigError(f"{source} line {_line(text, node.start_mark)}: an alias refers to the value that "
                                  f"contains it (a recursive structure); write the values out")
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in children if id(child) not in sizes)
            continue
        open_nodes.discard(key)
        sizes[key] = 1 + sum(sizes[id(child)] for child in children)
        depths[key] = 1 + max((depths[id(child)] for child in children), default=0)
        if sizes[key] > MAX_EXPANDED_VALUES:
            raise ConfigError(f"{source} line {_line(text, node.start_mark)}: its aliases expand to more than "
                              f"{MAX_EXPANDED_VALUES:,} values (the config reader's bound); write the values out")
        if depths[key] > MAX_NESTING:
            raise ConfigError(f"{source} line {_line(text, node.start_mark)}: nested more than {MAX_NESTING} levels "
                              f"deep (the config reader's bound; a config is sections of keys)")


_OPENING = (yaml.FlowSequenceStartToken, yaml.FlowMappingStartToken, yaml.BlockSequenceStartToken,
            yaml.BlockMappingStartToken)
_CLOSING = (yaml.FlowSequenceEndToken, yaml.FlowMappingEndToken, yaml.BlockEndToken)


def _check_spaces(token: yaml.ScalarToken, text: str, source: str) -> None:
    found = _MISPLACED_SPACE.search(token.value) if token.plain else None
    if found is not None:
        char = found.group(1) or found.group(2)
        where = "where a key or value starts (the indentation?)" if found.group(1) else "right after a key's colon"
        raise ConfigError(f"{source} line {_line(text, token.start_mark)}: the space U+{ord(char):04X} "
                          f"({unicodedata.name(char, 'a space')}) {where}: YAML needs a plain space there; retype it")


def _check_token_depth(text: str, source: str) -> None:
    """The nesting bound on the token stream, before any node is composed: PyYAML's parser slows down with the
    depth of a flow collection (`[[[[...` of 3000 levels took seconds) and its composer recurses once per level.
    And a space YAML does not read as one where its structure needs one (_check_spaces)."""
    scanner = StrictLoader(text)
    try:
        depth = 0
        while not scanner.check_token(yaml.StreamEndToken):
            token = scanner.get_token()
            if isinstance(token, yaml.ScalarToken):
                _check_spaces(token, text, source)
            depth += isinstance(token, _OPENING) - isinstance(token, _CLOSING)
            if depth >= MAX_NESTING:
                raise ConfigError(f"{source} line {_line(text, token.start_mark)}: nested more than {MAX_NESTING} "
                                  f"levels deep (the config reader's bound; a config is sections of keys)")
    except yaml.MarkedYAMLError:
        for token in scanner.tokens:  # scanned before the error was found: a misplaced space there is its cause
            if isinstance(token, yaml.ScalarToken):
                _check_spaces(token, text, source)
        raise
    finally:
        scanner.dispose()


def _bounded_load(text: str, source: str) -> Any:
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source} is longer than {MAX_CONFIG_BYTES:,} characters (the config reader's bound)")
    _check_token_depth(text, source)
    loader = StrictLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_node_bounds(root, text, source)
        return loader.construct_document(root)
    finally:
        loader.dispose()


_INDENTED = ("this line is indented unlike the lines above it (a key deeper or shallower than its section's others, "
             "or a key beside list items)")
# PyYAML's words for the mistakes a person makes most, which name its parser's tokens rather than the file's text.
_PROBLEMS = (
    ("but found another document", "a second YAML document starts here (after '---'); a config file holds one"),
    ("found character '\\t' that cannot start any token", "a tab; YAML indents with spaces only"),
    ("expected <block end>, but found", _INDENTED),
    ("mapping values are not allowed here", "a ': ' inside a value (quote the value), or a key indented deeper than "
                                            "its section's others"),
)


def _in_words(problem: str) -> str:
    return next((words for start, words in _PROBLEMS if problem.startswith(start)), problem)


def parse_yaml(text: str, source: str) -> Any:
    """The value `text` holds; a syntax error, a repeated key or a value past the reader's bounds (size, aliases,
    nesting) is one line naming `source` and the line."""
    try:
        return _bounded_load(text, source)
    except RecursionError:  # the composer recurses once per level of a flow collection: `[[[[...`
        raise ConfigError(f"{source}: nested more than {MAX_NESTING} levels deep (the config reader's bound; a "
                          f"config is sections of keys)") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" line {_line(text, mark)}" if mark is not None else ""
        problem = " ".join((exc.problem or exc.context or "invalid YAML").split())
        raise ConfigError(f"{source}{where}: {_in_words(problem)}") from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow: PyYAML named only its offset
        line = _line(text, yaml.Mark("", exc.position, 0, 0, None, None))
        raise ConfigError(f"{source} line {line}: the character U+{exc.character:04X} is not allowed in YAML "
                          f"(a binary file, or a stray control character?)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: {' '.join(str(exc).split())}") from None


# The lines of the other config formats a person may write or copy (TOML, INI, a .env or properties file): a
# `[section]` header alone on its line, or `key = value`. YAML read them as a list or a line of text, or failed in its
# parser's words ("expected '<document start>', but found '<scalar>'"), saying nothing of the format.
# Only the file's first line of content is looked at: further down, such a line may be the text of a YAML value.
# TOML's array of tables (`[[rewards]]`) is a header too; a shell's `export KEY=value` is a .env line.
_OTHER_FORMAT_LINE = re.compile(r"[ \t]*(?:(?P<header>\[\[?[A-Za-z_][\w.\- ]*\]\]?)[ \t]*(?:[#;].*)?|"
                                r"(?P<export>export[ \t]+)?[A-Za-z_][\w.\-]*[ \t]*=(?!=).*)")


def _other_format(text: str, source: str) -> ConfigError | None:
    """The refusal of a config written in TOML, INI or a .env file rather than YAML, naming its first line, or None.
    A byte order mark before that line is no part of it (an editor's "UTF-8 with BOM")."""
    lines = _LINE_BREAK.split(text.removeprefix("\ufeff"))
    first = next((i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith(("#", ";"))), None)
    match = _OTHER_FORMAT_LINE.fullmatch(lines[first]) if first is not None else None
    if match is None:
        return None
    kind = "a shell (.env) line" if match["export"] else "TOML or INI"
    return ConfigError(f"{source} line {first + 1}: {lines[first].strip()[:40]!r} is {kind}, not YAML; a "
                       f"config file is YAML: a section's name and a colon (run:), its keys indented below it "
                       f"(  max_steps: 3)")


# Byte order marks of the wider Unicode encodings an editor may save in ("Unicode" in Windows Notepad is UTF-16 LE),
# the 32-bit ones first: UTF-32 LE's mark starts with UTF-16 LE's.
_WIDE_MARKS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
               (codecs.BOM_UTF16_BE, "UTF-16"))


def _wide_encoding(data: bytes) -> str | None:
    """The UTF-16 / UTF-32 encoding `data` is in, by its byte order mark or, without one, by the zero bytes beside
    each ASCII character of its start, or None. Read as UTF-8, it was "not UTF-8 text (byte 0xff)" or "the character
    U+0000 is not allowed", neither naming the encoding to change."""
    mark = next((name for bom, name in _WIDE_MARKS if data.startswith(bom)), None)
    if mark is not None:
        return mark
    for width, name in ((4, "UTF-32"), (2, "UTF-16")):
        start = data[:64 - 64 % width] if len(data) >= 64 else data[:len(data) - len(data) % width]
        if len(start) < 2 * width:
            continue
        for at in (0, width - 1):  # little endian: the ASCII byte first; big endian: last
            text = start[at::width]
            zeros = bytes(len(start) - len(text))
            if bytes(b for k, b in enumerate(start) if k % width != at) == zeros and \
                    all(32 <= b < 127 or b in b"\t\r\n" for b in text):
                return name
    return None


def read_yaml(path: str | Path) -> dict:
    """A config file's mapping of sections."""
    if isinstance(path, str) and not path.strip():
        # blank text, refused as every text setting refuses it: as a Path, '' is '.', named as "a directory"
        raise ConfigError(f"config file {path!r}: expected the path of a YAML file, got blank text")
    path = Path(path)
    source = f"config file {str(path)!r}"
    problem = path_form_problem(str(path))
    if problem:  # before any look at it: past the system's bounds that look failed with an OSError naming nothing
        raise ConfigError(f"{source}: expected {problem}")
    if path.is_dir():
        raise ConfigError(f"{source} is a directory, not a YAML file")
    kind = special_file_kind(path)
    if kind is not None:
        raise ConfigError(f"{source} is {kind}, not a regular file; write the config to a file")
    if not path.is_file():
        raise ConfigError(f"{source} does not exist")
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{source} is larger than {MAX_CONFIG_BYTES:,} bytes (the config reader's bound)")
        wide = _wide_encoding(data)
        if wide is not None:
            raise ConfigError(f"{source} is {wide} text, not UTF-8; save it as UTF-8")
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{source} line {line}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}); save it as "
                          "UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{source} cannot be read: {exc.strerror or exc}") from None
    try:
        data = parse_yaml(text, source)
    except ConfigError as exc:
        raise _other_format(text, source) or exc from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        other = _other_format(text, source)
        if other is not None:
            raise other
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections, got {type(data).__name__}")
    return data


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=StrictDumper, sort_keys=False, allow_unicode=True)
