"""Every `python -m` command of the benchmarks and the engine's tools (found by what its `main` builds, so a new one
is covered without being listed): its parser is the engine's CommandParser (one line per argument error, not the
usage text), every option that reads a number or names reads it through a checked type (grpo_engine/cli_types.py),
and any value given to any option is accepted within its domain or refused in one line naming the option, before
the command's work (hypothesis). Before, plain `int` / `float` took `--repeats 0`, `--steps -1`, `--budget-s nan`,
`--memory-gib -5`, and a misspelt `--paths` entry was profiled as a failure after the others' work."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from command_parsers import captured_parser, command_modules
from grpo_engine.cli_parser import CommandLineError, CommandParser
from grpo_engine.config.schema import MAX_SEED

MODULES = command_modules()
PARSERS = {name: captured_parser(name) for name in MODULES}


def _options() -> list[tuple[str, argparse.Action]]:
    return [(name, action) for name, parser in PARSERS.items() for action in parser._actions
            if action.option_strings and action.nargs != 0 and not isinstance(action, argparse._HelpAction)
            and action.help != argparse.SUPPRESS]


OPTIONS = _options()


def _baseline(parser: argparse.ArgumentParser, but: argparse.Action) -> list[str]:
    """Values for the command's required arguments other than `but`: the option under test decides."""
    given = []
    for action in parser._actions:
        if action is but:
            continue
        if not action.option_strings and action.nargs in ("+", None):
            given.append("results.json")
        elif action.required and action.option_strings:
            given += [action.option_strings[0], "x"]
    return given


def test_the_commands_are_found_and_parse_with_the_engine_parser():
    assert {"benchmarks.gpu.command", "benchmarks.gpu.plan", "benchmarks.gpu.profile", "benchmarks.suite.run",
            "benchmarks.suite.report", "grpo_engine.tools.packing_bench"} <= set(MODULES), MODULES
    plain = [name for name, parser in PARSERS.items() if not isinstance(parser, CommandParser)]
    assert not plain, f"parsers that print the usage text on an error: {plain}"


def test_every_numeric_option_reads_through_a_checked_type():
    unchecked = [f"{name} {action.option_strings[0]}" for name, action in OPTIONS
                 if (action.type in (int, float) or (action.type is None and not action.choices and isinstance(
                     action.default, (int, float)) and not isinstance(action.default, bool)))]
    assert not unchecked, f"options whose numbers argparse takes unchecked (0, -1, nan): {unchecked}"


HOSTILE_TEXT = st.one_of(
    st.sampled_from(["", " ", "nan", "-nan", "inf", "-inf", "1e400", "-1", "0", "99999999999999999999", "2147483648",
                     "1.5", "-0", "true", "null", "[]", "a,b", ",", "floor,floor", "S1,", "../x", "/tmp/x", ".",
                     "x/y.json", "\uff11\uff12", "\udcff", "a\nb", "x" * 300]),
    st.integers(-2**70, 2**70).map(str), st.floats().map(repr), st.text(max_size=12))


def _within_domain(value) -> bool:
    """A parsed value any option may hold: whole numbers from 0 to the largest seed, other numbers finite and > 0."""
    values = value if isinstance(value, (list, tuple)) else [value]
    for item in values:
        if isinstance(item, int) and not isinstance(item, bool) and not 0 <= item <= MAX_SEED:
            return False
        if isinstance(item, float) and not (math.isfinite(item) and item > 0):
            return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(choice=st.sampled_from(OPTIONS), text=HOSTILE_TEXT)
def test_any_value_of_any_tool_option_is_accepted_in_its_domain_or_one_line_naming_it(choice, text, capsys):
    name, action = choice
    parser = PARSERS[name]
    option = action.option_strings[0]
    try:
        parsed = parser.parse_args([*_baseline(parser, action), f"{option}={text}"])
    except CommandLineError:
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and option in lines[0] and "usage:" not in lines[0], lines
        return
    value = getattr(parsed, action.dest)
    assert _within_domain(value), (name, option, text, value)
    if action.dest in ("name",):
        assert "/" not in value and value not in ("", ".", ".."), (name, option, value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(choice=st.sampled_from(OPTIONS), first=HOSTILE_TEXT, second=HOSTILE_TEXT)
def test_a_tool_option_given_twice_keeps_the_last_value_and_says_so(choice, first, second, capsys):
    """argparse's convention (a script's defaults, then a person's overrides), never silently: one note line."""
    name, action = choice
    parser = PARSERS[name]
    option = action.option_strings[0]
    try:
        parsed = parser.parse_args([*_baseline(parser, action), f"{option}={first}", f"{option}={second}"])
    except CommandLineError:
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) <= 2 and option in lines[-1], lines  # the note, if the first was taken, then the refusal
        return
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]
    alone = {text: getattr(parser.parse_args([*_baseline(parser, action), f"{option}={text}"]), action.dest)
             for text in (first, second)}
    capsys.readouterr()
    assert getattr(parsed, action.dest) == alone[second], "the last value is the one kept"
    assert len(notes) == (alone[first] != alone[second]) and all(option in note for note in notes), notes


# ---- the paths a tool writes ------------------------------------------------------------------------------------
from grpo_engine.cli_types import file_to_update, output_directory, output_file  # noqa: E402

PATH_TYPES = (output_file, output_directory, file_to_update)
# Options that name where a tool writes (or what it rewrites), by their destination.
WRITTEN = {"out", "plots", "output_dir", "update_readme", "output"}
PATH_OPTIONS = [(name, action) for name, action in OPTIONS if action.dest in WRITTEN]


def test_every_option_naming_where_a_tool_writes_reads_it_through_a_checked_path_type():
    assert len(PATH_OPTIONS) >= 6, PATH_OPTIONS
    unchecked = [f"{name} {action.option_strings[0]}" for name, action in PATH_OPTIONS if action.type not in PATH_TYPES]
    assert not unchecked, f"options whose path is found wrong only when the results are written: {unchecked}"


SITUATIONS = ("a directory", "a file", "under a file", "a missing directory's", "a character device", "new")


def _situated(tmp: Path, situation: str, name: str) -> str:
    (tmp / "dir").mkdir(exist_ok=True)
    (tmp / "file").write_text("someone's notes\n")
    return {"a directory": str(tmp / "dir"), "a file": str(tmp / "file"), "under a file": str(tmp / "file" / name),
            "a missing directory's": str(tmp / "missing" / name), "a character device": os.devnull,
            "new": str(tmp / name)}[situation]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(choice=st.sampled_from(PATH_OPTIONS), situation=st.sampled_from(SITUATIONS),
       name=st.sampled_from(["x.md", "plots", "r.json", "sub/x"]))
def test_a_path_a_tool_cannot_write_is_refused_in_one_line_naming_the_option(choice, situation, name, tmp_path,
                                                                             capsys):
    """Before, `report --plots FILE`, `kernel_report --out FILE` and `demo_seeds --output-dir FILE` were tracebacks
    after the work (half a minute of compiling, for the kernel report); `report --update-readme DIR` one before it."""
    name_, action = choice
    parser = PARSERS[name_]
    path = _situated(tmp_path, situation, name)
    kind = action.type
    writable = {output_file: situation in ("new", "a missing directory's", "a file"),  # a file: replaced whole, as -o
                output_directory: situation in ("new", "a missing directory's", "a directory"),
                file_to_update: situation == "a file"}[kind]
    option = action.option_strings[0]
    capsys.readouterr()
    try:
        parsed = parser.parse_args([*_baseline(parser, action), f"{option}={path}"])
    except CommandLineError:
        lines = capsys.readouterr().err.splitlines()
        assert not writable, (name_, option, situation)
        assert len(lines) == 1 and option in lines[0] and "usage:" not in lines[0], lines
        return
    assert writable, (name_, option, situation, getattr(parsed, action.dest))
