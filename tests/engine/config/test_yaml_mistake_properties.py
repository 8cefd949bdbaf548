"""The mistakes a person makes in a config file's YAML (a tab for indentation, a key indented unlike its section's
others, a value holding ': ', a second document after '---', a control character pasted in) are each one line naming
the file and the line of the mistake, in words about the text rather than PyYAML's tokens. Before: "found character
'\\t' that cannot start any token", "expected <block end>, but found '<block mapping start>'", "but found another
document", and for a control character "special characters are not allowed in "<unicode string>", position 19" with
no line at all. A no-break or ideographic space in the indentation, or right after a key's colon, made a key of
another name, or the text of the section above: refused for that section ("run: expected a mapping of keys")."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from grpo_engine.config import ConfigError
from grpo_engine.config.strict_yaml import dump_yaml, parse_yaml

KEYS = st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True)
VALUES = st.one_of(st.integers(-5, 500).map(str), st.sampled_from(["true", "null", "1e-5", "linear", "runs/x"]))
ODD_SPACES = "\u00a0\u2007\u202f\u3000\ufeff"
# PyYAML's own words, which name its scanner's and parser's tokens
TOKEN_WORDS = ("token", "<block", "<unicode string>", "position", "found another document", "mapping values")


@st.composite
def configs(draw):
    """(lines of a config: sections of two or more keys at two spaces, [line indices of a section's later keys])"""
    lines, later = [], []
    for section in draw(st.lists(KEYS, min_size=1, max_size=3, unique=True)):
        lines.append(f"{section}:")
        for k, key in enumerate(draw(st.lists(KEYS, min_size=2, max_size=4, unique=True))):
            if k:
                later.append(len(lines))
            lines.append(f"  {key}: {draw(VALUES)}")
    return lines, later


MISTAKES = {
    "tab": lambda line: "\t" + line.lstrip(" "),
    "shallower": lambda line: line[1:],
    "deeper": lambda line: " " + line,
    "colon in a value": lambda line: line + ": more",
    "control character": lambda line: line + "\x07",
    "NUL": lambda line: line[:4] + "\x00" + line[4:],
    "escape sequence": lambda line: line + "\x1b[0m",
    # a space pasted from a web page or a document (a no-break space, an ideographic one) where YAML needs its own
    **{f"U+{ord(space):04X} indenting": (lambda space: lambda line: space + line[1:])(space) for space in ODD_SPACES},
    **{f"U+{ord(space):04X} after a colon": (lambda space: lambda line: line.replace(": ", ":" + space, 1))(space)
       for space in ODD_SPACES},
}


@settings(max_examples=150, deadline=None)
@given(config=configs(), mistake=st.sampled_from(sorted(MISTAKES) + ["second document"]), data=st.data())
def test_a_yaml_mistake_is_one_line_naming_its_line(config, mistake, data):
    lines, later = config
    at = data.draw(st.sampled_from(later))
    if mistake == "second document":
        lines = lines[:at] + ["---"] + lines[at:]
    else:
        lines = lines[:at] + [MISTAKES[mistake](lines[at])] + lines[at + 1:]
    text = "\n".join(lines) + "\n"
    parse_yaml("\n".join(lines[:at]) + "\n", "f.yaml")  # the text before the mistake reads
    with pytest.raises(ConfigError) as refused:
        parse_yaml(text, "config file 'f.yaml'")
    message = str(refused.value)
    # A key indented unlike its section's others is found on its line, or on the next one where that one is then
    # indented unlike it (PyYAML closes the section at the shallower key).
    shown = [at + 1, at + 2] if mistake in ("shallower", "deeper") else [at + 1]
    assert "\n" not in message and any(message.startswith(f"config file 'f.yaml' line {line}: ") for line in shown), \
        (text, message)
    assert not any(word in message for word in TOKEN_WORDS), message


@settings(max_examples=100, deadline=None)
@given(text=st.text(st.sampled_from(["a", "k", "_", ":", " ", "1", *ODD_SPACES]), max_size=8))
def test_text_holding_those_spaces_is_saved_so_that_it_reads_back(text):
    # the saved config.yaml quotes a text the reader would take for a misplaced space
    saved = {"data": {"system_prompt": text}}
    assert parse_yaml(dump_yaml(saved), "config.yaml") == saved
