"""A config's YAML carries plain values only, and its messages count lines as an editor does.

Tags outside YAML 1.2's core schema (`!!python/object`, `!!binary`, `!!set`, `!!timestamp`, a local `!tag`) built
bytes, sets and dates no setting takes, or were refused in PyYAML's words; a core tag on a value not of its kind
(`!!int x`) raised a ValueError traceback. NEL (U+0085) and the Unicode line / paragraph separators inside a value
count as line breaks for PyYAML, so every line number after one was wrong. Each case: one line naming the source
and the line a person finds in an editor.
"""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

import pytest

from grpo_engine.config import ConfigError, parse_yaml
from grpo_engine.config.strict_yaml import read_yaml

DERANDOMIZE = bool(os.environ.get("CI"))
SOURCE = "config file 'c.yaml'"

words = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
foreign_tags = st.one_of(
    st.sampled_from(["!!python/object:os.system", "!!python/tuple", "!!python/name:builtins.eval", "!!binary",
                     "!!set", "!!omap", "!!pairs", "!!timestamp", "!!merge", "!!value", "!!yaml"]),
    words.map(lambda word: f"!{word}"), words.map(lambda word: f"!!{word}x"))
# a core scalar tag and a value that is not of its kind
mismatched = st.one_of(
    st.tuples(st.just("!!int"), st.sampled_from(["x", "1.5", "0x1f", "1_000", "true", "''", "1e3"])),
    st.tuples(st.just("!!float"), st.sampled_from(["x", "1_0.5", "nan", "inf", "1e", "true"])),
    st.tuples(st.just("!!bool"), st.sampled_from(["yes", "no", "on", "1", "x", "''"])),
    st.tuples(st.just("!!null"), st.sampled_from(["x", "0", "none", "false"])))
breaks = st.sampled_from(["\n", "\r\n"])
odd_breaks = st.sampled_from(["\x85", "\u2028", "\u2029"])


def _refusal(text: str) -> str:
    with pytest.raises(ConfigError) as refused:
        parse_yaml(text, SOURCE)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(SOURCE)
    return message


def _filler(names: list[str], newline: str) -> str:
    return "".join(f"{name}_{i}: 1{newline}" for i, name in enumerate(names))


@settings(max_examples=150, deadline=None, derandomize=DERANDOMIZE)
@given(st.lists(words, max_size=5), foreign_tags, st.sampled_from(["x", "1", "[1, 2]", "{a: 1}", "''"]), breaks,
       st.booleans())
def test_a_tag_outside_the_core_schema_is_refused_in_the_projects_words(before, tag, value, newline, nested):
    line = len(before) + 1 + nested
    entry = f"run:{newline}  seed: {tag} {value}{newline}" if nested else f"seed: {tag} {value}{newline}"
    message = _refusal(_filler(before, newline) + entry)
    assert message.startswith(f"{SOURCE} line {line}: the tag {tag} is not read in config files"), message


@settings(max_examples=100, deadline=None, derandomize=DERANDOMIZE)
@given(st.lists(words, max_size=5), mismatched, breaks)
def test_a_core_tag_on_a_value_of_another_kind_is_refused(before, tag_and_value, newline):
    tag, value = tag_and_value
    message = _refusal(_filler(before, newline) + f"key: {tag} {value}{newline}")
    assert message.startswith(f"{SOURCE} line {len(before) + 1}: ") and f"is not a {tag} value" in message, message


@settings(max_examples=50, deadline=None, derandomize=DERANDOMIZE)
@given(st.sampled_from([("!!int", "3", 3), ("!!float", "1", 1.0), ("!!str", "1", "1"), ("!!bool", "true", True),
                        ("!!null", "~", None), ("!!seq", "[1]", [1]), ("!!map", "{a: 1}", {"a": 1})]))
def test_core_tags_on_values_of_their_kind_still_read(case):
    tag, text, value = case
    assert parse_yaml(f"key: {tag} {text}\n", SOURCE) == {"key": value}


@settings(max_examples=150, deadline=None, derandomize=DERANDOMIZE)
@given(st.lists(st.tuples(words, st.lists(odd_breaks, max_size=3), st.sampled_from(['"', "'"])), min_size=1,
                max_size=6),
       breaks, st.sampled_from(["repeat", "syntax", "tag"]))
def test_line_numbers_count_only_the_lines_an_editor_shows(entries, newline, fault):
    """Values holding NEL / LS / PS (quoted, so they stay text); then a fault on the next line."""
    text = "".join(f"{name}_{i}: {quote}a{''.join(odd)}b{quote}{newline}"
                   for i, (name, odd, quote) in enumerate(entries))
    line = len(entries) + 1
    if fault == "repeat":
        text += f"{entries[0][0]}_0: 2{newline}"
        expected = f"line {line}: key '{entries[0][0]}_0' given twice in one mapping (first on line 1)"
    elif fault == "tag":
        text += f"key: !!binary aGk={newline}"
        expected = f"line {line}: the tag !!binary"
    else:
        text += f"key: [1{newline}"
        expected = f"line {line + 1}: "
    assert _refusal(text).startswith(f"{SOURCE} {expected}")


def test_a_file_read_from_disk_names_the_editors_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes("run:\r\n  name: \"a\u2028b\x85c\"\r\n  seed: !!python/object:os.system x\r\n".encode())
    with pytest.raises(ConfigError) as refused:
        read_yaml(path)
    assert str(refused.value).startswith(f"config file {str(path)!r} line 3: the tag !!python/object:os.system is "
                                         f"not read in config files")
