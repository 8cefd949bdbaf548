"""Property-based tests of the command line as a whole: every option of every command (the config keys' flags
included), given a fresh hostile value, written `--flag value` or `--flag=value`, left without its value or given
twice, is accepted (the command gets as far as its work, replaced here by a sentinel) or refused in one line naming
the option or the key it sets; never a traceback, never the usage text, never a silently replaced value."""

from __future__ import annotations

import argparse
import importlib

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from grpo_engine.cli import build_parser, main
from grpo_engine.launch_env import ENVIRONMENT, check_environment
from grpo_engine.config import ConfigError

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Each command's required arguments, so that the option under test is what decides.
BASELINE = {"train": [], "eval": ["--model", "org/name"], "plot": ["."], "serve": ["--model", "org/name"],
            "bench": []}
# The work each command starts once its arguments are accepted.
WORK = {"train": ("grpo_engine.trainer", "train"), "eval": ("grpo_engine.tools.evaluate", "run_eval"),
        "plot": ("grpo_engine.state.plot", "plot_run"), "serve": ("grpo_engine.tools.serve", "serve"),
        "bench": ("grpo_engine.tools.bench", "bench_and_print")}
# The config key a shortcut option sets (its errors name the key), and what --config's errors call it.
ALSO_NAMED = {"--model": ("model.name_or_path",), "--data": ("data.path",), "--output-dir": ("run.output_dir",),
              "--max-steps": ("run.max_steps",), "--resume": ("run.resume",), "--num-samples": ("run.eval_num_samples",),
              "--config": ("config file",)}

HOSTILE_TEXT = st.one_of(
    st.sampled_from(["", " ", "nan", "-nan", "inf", "-inf", "1e400", "-1", "0", "99999999999999999999", "2147483648",
                     "1.5", "true", "True", "yes", "null", "~", "[]", "{}", "[1, 2]", "{a: 1}", "{1: 2}", "-x", "--x",
                     "1_000", "0x10", "\uff11\uff12", "&a [*a, *a]", "!!python/object:os.system ls", "\udcff",
                     "a\nb", "\u202e", "x" * 300]),
    st.integers(-2**70, 2**70).map(str),
    st.floats().map(repr),
    st.text(max_size=20),
)


def _options() -> list[tuple[str, str, bool]]:
    """(command, option, takes a value) for every option of every command but --help."""
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    found = []
    for command, parser in commands.items():
        for action in parser._actions:
            flags = [flag for flag in action.option_strings if flag.startswith("--")]
            if flags and not isinstance(action, argparse._HelpAction):
                found.append((command, flags[0], action.nargs != 0))
    return found


OPTIONS = _options()


class WorkStarted(Exception):
    """The command accepted its arguments and began its work."""


@pytest.fixture()
def no_work(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)

    def started(*args, **kwargs):
        raise WorkStarted

    for module, name in WORK.values():
        monkeypatch.setattr(importlib.import_module(module), name, started)


def _names(option: str) -> tuple[str, ...]:
    return (option, option.removeprefix("--"), *ALSO_NAMED.get(option, ()))


def _run(argv: list[str], capsys) -> tuple[str, list[str]]:
    """('accepted' or the exit status, stderr's lines but the notes of a replaced value)."""
    try:
        outcome = str(main(argv))
    except WorkStarted:
        outcome = "accepted"
    err = capsys.readouterr().err
    assert "Traceback" not in err and "usage:" not in err, err
    return outcome, [line for line in err.splitlines() if not line.startswith("note: ")]


def _accepted_or_named(outcome: str, lines: list[str], option: str) -> None:
    if outcome == "accepted":
        return
    assert outcome in ("1", "2"), (outcome, lines)
    assert len(lines) == 1, lines
    assert any(name in lines[0] for name in _names(option)), (option, lines)


@SETTINGS
@given(choice=st.sampled_from(OPTIONS), text=HOSTILE_TEXT, joined=st.booleans())
@example(choice=("train", "--resume", True), text="-1e+16", joined=False)  # was "unknown flag -1e+16"
def test_any_value_of_any_option_is_accepted_or_one_line_naming_it(choice, text, joined, no_work, capsys):
    command, option, takes_value = choice
    given_as = [f"{option}={text}"] if joined or not takes_value else [option, text]
    outcome, lines = _run([command, *BASELINE[command], *given_as], capsys)
    _accepted_or_named(outcome, lines, option)


@SETTINGS
@given(choice=st.sampled_from([(c, o) for c, o, takes_value in OPTIONS if takes_value]))
def test_an_option_without_its_value_is_one_line_naming_it(choice, no_work, capsys):
    command, option = choice
    outcome, lines = _run([command, *BASELINE[command], option], capsys)
    if option == "--resume":  # its value is optional: the latest checkpoint
        return
    assert outcome == "2" and len(lines) == 1 and f"argument {option}: expected" in lines[0], lines


@SETTINGS
@given(choice=st.sampled_from([(c, o) for c, o, takes_value in OPTIONS if takes_value]), first=HOSTILE_TEXT,
       second=HOSTILE_TEXT)
def test_a_repeated_option_says_which_value_it_uses(choice, first, second, no_work, capsys):
    command, option = choice
    try:
        outcome = str(main([command, *BASELINE[command], f"{option}={first}", f"{option}={second}"]))
    except WorkStarted:
        outcome = "accepted"
    err = capsys.readouterr().err
    assert "Traceback" not in err and "usage:" not in err, err
    notes = [line for line in err.splitlines() if line.startswith("note: ")]
    if first != second and not (outcome == "2" and "argument " in err):  # a value argparse refuses stops at once
        # (one note more where the command's required arguments above give the option too: eval's --model)
        assert 1 <= len(notes) <= 2 and all(option in note and "is used" in note for note in notes), err
    _accepted_or_named(outcome, [line for line in err.splitlines() if line not in notes], option)


# ------------------------------------------------------------------------------------------ environment

@SETTINGS
@given(name=st.sampled_from(sorted(ENVIRONMENT)), text=HOSTILE_TEXT)
def test_any_value_of_a_checked_environment_variable_is_accepted_or_one_line_naming_it(name, text):
    try:
        check_environment({name: text})
    except ConfigError as exc:
        message = str(exc)
        assert f"environment variable {name}=" in message and "\n" not in message, message


@pytest.mark.parametrize("environ, named", [
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE"), ({"RANK": "-1"}, "RANK"), ({"LOCAL_RANK": "\uff11"}, "LOCAL_RANK"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 must be below WORLD_SIZE=2"), ({"MASTER_PORT": "70000"}, "MASTER_PORT"),
    ({"OMP_NUM_THREADS": "0"}, "OMP_NUM_THREADS"), ({"HF_HUB_OFFLINE": "maybe"}, "HF_HUB_OFFLINE"),
])
def test_a_bad_environment_variable_stops_every_command_before_any_work(environ, named, no_work, monkeypatch, capsys):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    for command in ("train", "eval", "plot"):
        outcome, lines = _run([command, *BASELINE[command]], capsys)
        assert outcome == "2" and len(lines) == 1 and named in lines[0], lines


@pytest.mark.parametrize("environ", [
    {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
     "MASTER_PORT": "29500"},
    {"OMP_NUM_THREADS": "4,2"}, {"HF_HUB_OFFLINE": "1"}, {"HF_HUB_OFFLINE": "false"}, {"TRANSFORMERS_OFFLINE": ""},
])
def test_what_the_launchers_and_libraries_set_is_accepted(environ):
    check_environment(environ)


# ------------------------------------------------------------------------------------------ forms of the flags

def _other_option(command: str, draw_index: int) -> str:
    others = [option for c, option, _ in OPTIONS if c == command]
    return others[draw_index % len(others)]


@SETTINGS
@given(choice=st.sampled_from([(c, o) for c, o, takes_value in OPTIONS if takes_value and o != "--resume"]),
       index=st.integers(0, 10**6), then=st.sampled_from(["", "=3", " 3"]))
def test_a_value_left_out_before_another_flag_is_one_line_naming_the_flag(choice, index, then, no_work, capsys):
    # `--run.max_steps --run.seed 3`: the next flag was taken for the value, then train said only "unexpected value
    # '3'"; `serve --model --port 80` served a model named '--port'
    command, option = choice
    other = _other_option(command, index)
    argv = [command, *BASELINE[command], option, other + then.replace(" 3", ""), *(["3"] if then == " 3" else [])]
    outcome, lines = _run(argv, capsys)
    assert outcome == "2" and len(lines) == 1 and f"argument {option}: expected " in lines[0], (argv, lines)
    assert "argument" in lines[0].split(f"argument {option}: expected ")[1], (argv, lines)  # one, at least one


@SETTINGS
@given(command=st.sampled_from(["train", "eval", "bench"]), index=st.integers(0, 10**6))
def test_arguments_after_a_double_dash_are_said_unread(command, index, no_work, capsys):
    # each was "unknown flag" with itself as the suggestion: "unknown flag --batch-size (did you mean --batch-size?)"
    option = _other_option(command, index)
    outcome, lines = _run([command, *BASELINE[command], "--", option, "3"], capsys)
    assert outcome == "2" and len(lines) == 1 and "after '--' are not read" in lines[0], lines


@SETTINGS
@given(choice=st.sampled_from([(c, o) for c, o, takes_value in OPTIONS if takes_value and c != "serve"]),
       space=st.sampled_from([" ", "  ", "\t", " = ", " ="]), upper=st.booleans())
def test_a_flag_with_a_space_or_in_capitals_names_the_flag_meant(choice, space, upper, no_work, capsys):
    # (serve passes the arguments it does not take on to vLLM, as written)
    command, option = choice
    written = option.upper() if upper else option
    outcome, lines = _run([command, *BASELINE[command], f"{written}{space}3"], capsys)
    assert outcome == "2" and len(lines) == 1, lines
    if upper:
        assert f"did you mean {option}?" in lines[0], lines
    else:
        assert f"write {option}=VALUE" in lines[0], lines
