"""Property tests of the forms a config file takes that are not the schema's: a key written at another place of the
tree than its own (a flag's dotted name `run.max_steps: 3`, `--run.max_steps: 3`, a section's key outside its
section), a section written with no keys under it (YAML's null: its keys commented out), a file in TOML, INI or .env
form, one saved as UTF-16 / UTF-32, a text setting whose value YAML reads as a number, and a blank flag value for a
number.

Before: "unknown key 'run.max_steps' (valid keys: model, data, ...)", naming as unknown the name --help lists;
"run: expected a mapping of keys, got None"; "line 2: expected '<document start>', but found '<scalar>'"; "expected
a string, got 1234567" for a commit; and "run.max_steps: expected a non-empty text" (or "got None") for `""`."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_engine.cli import _overrides, build_parser, join_flag_values
from grpo_engine.config import ConfigError, leaf_fields, load_config
from grpo_engine.config.loading import config_from_dict
from grpo_engine.config.schema import EngineConfig
from grpo_engine.config.value_kinds import value_kinds
from grpo_engine.data.demo_task import DEMO_PRESET

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
LEAVES = sorted(leaf_fields())
SECTIONS = sorted({key.rsplit(".", 1)[0] for key in LEAVES if "." in key})
TOP = set(EngineConfig.model_fields)
PARSER = build_parser()


def _nest(dotted: str, value) -> dict:
    *parents, leaf = dotted.split(".")
    data = {leaf: value}
    for part in reversed(parents):
        data = {part: data}
    return data


def _refusal(data: dict) -> str:
    with pytest.raises(ConfigError) as refused:
        config_from_dict(data)
    message = str(refused.value)
    assert "\n" not in message, message
    return message


@given(key=st.sampled_from(LEAVES), dashes=st.sampled_from(["", "--"]), depth=st.integers(0, 2))
def test_a_flags_dotted_name_in_a_file_says_how_to_nest_it(key, dashes, depth):
    # written from the top (`run.max_steps:`), or inside some of its own sections (`rollout: {vllm.x: ...}`)
    parts = key.split(".")
    depth = min(depth, len(parts) - 2) if len(parts) > 1 else 0
    inside, rest = parts[:depth], ".".join(parts[depth:])
    data = {dashes + rest: leaf_fields()[key].get_default(call_default_factory=True)}
    for part in reversed(inside):
        data = {part: data}
    message = _refusal(data)
    if "." not in rest:  # a top-level leaf or a section's last name: a key given in its own place, with dashes
        return
    assert f"the dotted name is the flag's (--{key})" in message and "nests its keys" in message, message


@given(key=st.sampled_from([key for key in LEAVES if "." in key]), at=st.sampled_from(["top", *SECTIONS]))
def test_a_sections_key_elsewhere_says_which_section_it_belongs_to(key, at):
    section, name = key.rsplit(".", 1)
    if at == section or name in TOP or (at != "top" and name in leaf_fields(_section_model(at))):
        return  # its own place, or a name that is also a key of the place it is written at
    value = leaf_fields()[key].get_default(call_default_factory=True)
    message = _refusal({name: value} if at == "top" else _nest(f"{at}.{name}", value))
    # (a shared setting written in the section that shares it says where it is set: "set rollout.temperature")
    assert (f"{name} is a key of " in message and section in message and "write it there" in message
            or f"set {key}" in message), message


def _section_model(dotted: str):
    model = EngineConfig
    for part in dotted.split("."):
        model = model.model_fields[part].annotation
    return model


@SETTINGS
@given(blank=st.lists(st.sampled_from(SECTIONS), min_size=1, unique=True), preset=st.booleans(),
       comment=st.sampled_from(["", "  # max_steps: 3\n"]))
def test_a_section_with_no_keys_under_it_sets_nothing(blank, preset, comment, tmp_path):
    tree: dict = {}  # only the outermost of nested sections is written with no keys, as a person would write it
    for section in sorted(blank, key=len):
        *parents, last = section.split(".")
        node = tree
        for part in parents:
            node = node.get(part) if isinstance(node.get(part), dict) else None
            if node is None:
                break
        if node is not None:
            node[last] = {}

    def lines(node: dict, depth: int) -> list[str]:
        return [text for name, inner in node.items()
                for text in [f"{'  ' * depth}{name}:", *(lines(inner, depth + 1) if inner else [comment])]]

    path = tmp_path / "c.yaml"
    path.write_text("\n".join(lines(tree, 0)) + "\n")
    base = DEMO_PRESET if preset else None  # merged over a preset, the empty section keeps the preset's keys
    assert load_config(path, preset=base) == load_config(None, preset=base)


NAMES = st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True)
TOML_VALUES = st.sampled_from(["3", "1e-5", "true", '"runs/x"', "'linear'", "[1, 2]"])


@SETTINGS
@given(headers=st.sampled_from(["", "[{}]", "[[{}]]"]), sections=st.lists(NAMES, min_size=1, max_size=3, unique=True),
       keys=st.lists(NAMES, min_size=1, max_size=3, unique=True), values=TOML_VALUES,
       spaces=st.sampled_from([" = ", "=", " =\t"]), preamble=st.sampled_from(["", "# run settings\n", "\n; x\n"]),
       mark=st.sampled_from(["", "\ufeff"]), export=st.booleans())
def test_a_toml_ini_or_env_file_is_named_as_such(headers, sections, keys, values, spaces, preamble, mark, export,
                                                 tmp_path):
    """TOML's array of tables ([[rewards]]), a file opening with a byte order mark (an editor's "UTF-8 with BOM")
    and a .env file's `export KEY=value` were refused in the YAML parser's words, naming no format."""
    export = export and not headers  # a shell file has no sections
    body = "".join((headers.format(section) + "\n" if headers else "") +
                   "".join(f"{'export ' if export else ''}{key}{spaces}{values}\n" for key in keys)
                   for section in sections)
    path = tmp_path / "c.yaml"
    path.write_text(mark + preamble + body)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    message = str(refused.value)
    line = preamble.count("\n") + 1
    kind = "a shell (.env) line" if export else "TOML or INI"
    assert "\n" not in message and f"line {line}: " in message and f"is {kind}, not YAML" in message, message


@SETTINGS
@given(encoding=st.sampled_from(["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"]),
       crlf=st.booleans(), keys=st.lists(NAMES, min_size=1, max_size=3, unique=True))
def test_a_config_saved_in_a_wider_unicode_encoding_is_named_by_it(encoding, crlf, keys, tmp_path):
    """Notepad's "Unicode" (UTF-16 LE with its mark) was "not UTF-8 text (byte 0xff)"; without the mark, "the
    character U+0000 is not allowed in YAML (a binary file?)". Either way the file is named with its encoding."""
    text = "run:\n" + "".join(f"  {key}: 3\n" for key in keys)
    path = tmp_path / "c.yaml"
    path.write_bytes((text.replace("\n", "\r\n") if crlf else text).encode(encoding))
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    width = encoding[:6].upper()
    assert str(refused.value) == f"config file {str(path)!r} is {width} text, not UTF-8; save it as UTF-8"


def test_a_yaml_value_that_reads_like_toml_further_down_is_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data:\n  system_prompt: |\n    [x]\n    a = b\nrun:\n  max_steps: 3\n")
    assert load_config(path, preset=DEMO_PRESET).data.system_prompt == "[x]\na = b\n"


# text settings but those of fixed choices (Literal: a number there is refused listing the choices)
TEXT_ONLY = [key for key in LEAVES if str in value_kinds(leaf_fields()[key].annotation)
             and not {int, float, bool, list} & value_kinds(leaf_fields()[key].annotation)
             and "Literal" not in str(leaf_fields()[key].annotation)]
NUMBERS_ONLY = [key for key in LEAVES if {int, float} & value_kinds(leaf_fields()[key].annotation)
                and not {str, list} & value_kinds(leaf_fields()[key].annotation)]


@given(key=st.sampled_from(TEXT_ONLY), value=st.one_of(st.integers(0, 10**9), st.floats(0, 1e6), st.booleans()))
def test_a_text_setting_that_yaml_reads_as_a_number_says_to_quote_it(key, value):
    message = _refusal(_nest(key, value))
    assert message.startswith(f"{key}: ") and "quote it" in message, message


@given(key=st.sampled_from(NUMBERS_ONLY), blank=st.sampled_from(["", " ", "\t"]))
def test_a_blank_flag_for_a_number_is_refused_as_the_numbers_kind(key, blank):
    args = PARSER.parse_args(join_flag_values(["train", f"--{key}={blank}"], PARSER))
    with pytest.raises(ConfigError) as refused:
        load_config(overrides=_overrides(args, {}))
    message = str(refused.value)
    assert message.startswith(f"{key}: expected ") and f"got {blank!r}" in message, message
    assert "non-empty text" not in message, message
