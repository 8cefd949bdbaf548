"""The config reader's bounds (size, alias expansion, nesting), over generated files: a file within them reads as
the values it spells out; past one it is refused fast, in one line naming the file, the line and the bound."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings, strategies as st

from grpo_engine.cli import main
from grpo_engine.config import ConfigError, parse_yaml, read_yaml
from grpo_engine.config.strict_yaml import MAX_CONFIG_BYTES, MAX_EXPANDED_VALUES, MAX_NESTING


def alias_chain(width: int, depth: int) -> str:
    """`l0` a list of `width` scalars, each `l{k}` a list of `width` aliases of `l{k-1}`: width**(depth+1) leaves."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{k}: &l{k} [{', '.join([f'*l{k - 1}'] * width)}]" for k in range(1, depth + 1)]
    return "\n".join(lines) + "\n"


def expanded_values(width: int, depth: int) -> int:
    """Nodes of the expanded tree: the root mapping, its keys, and each list with its items."""
    per_level = [width]  # l0's size below its own node
    for _ in range(depth):
        per_level.append(width * (1 + per_level[-1]))
    return 1 + sum(2 + size for size in per_level)


def nested(width: int, depth: int):
    value = ["lol"] * width
    tree = {"l0": value}
    for k in range(1, depth + 1):
        value = [value] * width
        tree[f"l{k}"] = value
    return tree


def _refused_fast(text: str, fragment: str) -> str:
    start = time.process_time()
    with pytest.raises(ConfigError) as caught:
        parse_yaml(text, "config file 'x.yaml'")
    assert time.process_time() - start < 2.0
    message = str(caught.value)
    assert "\n" not in message and message.startswith("config file 'x.yaml'") and fragment in message, message
    return message


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=12), st.integers(min_value=0, max_value=9))
def test_aliases_read_as_their_values_within_the_bound_and_are_refused_past_it(width, depth):
    text = alias_chain(width, depth)
    if expanded_values(width, depth) <= MAX_EXPANDED_VALUES:
        assert parse_yaml(text, "config file 'x.yaml'") == nested(width, depth)
    else:
        _refused_fast(text, f"aliases expand to more than {MAX_EXPANDED_VALUES:,} values")


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=1, max_value=3000), st.sampled_from(["flow list", "flow map", "block map"]))
def test_nesting_reads_within_the_bound_and_is_refused_past_it(levels, style):
    if style == "flow list":
        text, value = "[" * levels + "1" + "]" * levels, 1
        for _ in range(levels):
            value = [value]
    elif style == "flow map":
        text, value = "{a: " * levels + "1" + "}" * levels, 1
        for _ in range(levels):
            value = {"a": value}
    else:
        levels = min(levels, 200)  # a block mapping indents one more space per level
        text, value = "".join(" " * i + "a:\n" for i in range(levels - 1)) + " " * (levels - 1) + "a: 1\n", 1
        for _ in range(levels):
            value = {"a": value}
    depth = levels + 1  # the scalar itself is a level
    if depth <= MAX_NESTING:
        assert parse_yaml(text, "config file 'x.yaml'") == value
    else:
        _refused_fast(text, f"nested more than {MAX_NESTING} levels deep")


@pytest.mark.parametrize("text", ["a: &a [*a]", "a: &a {b: *a}", "a: &a [1, [2, *a]]", "run: &r {x: [*r]}"])
def test_an_alias_inside_its_own_value_is_refused(text):
    _refused_fast(text, "an alias refers to the value that contains it")


def test_a_file_past_the_size_bound_is_refused_without_reading_it_whole(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * (MAX_CONFIG_BYTES + 10) + "\nrun: {max_steps: 3}\n")
    with pytest.raises(ConfigError, match=f"larger than {MAX_CONFIG_BYTES:,} bytes"):
        read_yaml(path)
    _refused_fast("a: " + "x" * MAX_CONFIG_BYTES, "longer than")


def test_the_504_byte_nested_alias_file_is_one_line_in_a_second(tmp_path, capsys):
    width = 9
    path = tmp_path / "laughs.yaml"
    path.write_text(alias_chain(width, 8) + "run: {max_steps: *l8}\n")
    assert path.stat().st_size < 600
    start = time.monotonic()
    assert main(["train", "--config", str(path)]) == 2
    assert time.monotonic() - start < 5.0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "aliases expand to more than" in err, err
