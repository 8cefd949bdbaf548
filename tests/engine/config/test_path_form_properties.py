"""Property test of the FORM of every path setting (the schema's PathSetting keys: run.output_dir, run.resume,
data.path, model.name_or_path, ...), as a YAML file or a flag gives it: a name with a control character in it (NUL,
a line break, a tab, an escape, C1 controls) or a character that shows as nothing or as a line break (Unicode's
format characters: a zero-width space, a bidirectional override, a byte-order mark; its line and paragraph
separators), a name longer than a file system's 255 bytes, a path longer than its
4095. Each is refused when the config loads, in one line naming the key, before anything looks for the file;
any other name of a legal form is not refused for its form. Before, NUL and line breaks were taken (a run directory
named over two lines), and an over-long name failed at the first look with "OSError: File name too long", naming
no key."""

from __future__ import annotations

import os
import re
import unicodedata

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_engine.config import ConfigError, load_config
from setting_kinds import path_keys

DERANDOMIZE = bool(os.environ.get("CI"))
NAME_MAX_BYTES, PATH_MAX_BYTES = 255, 4095  # Linux's and macOS's bounds on a file name and a whole path
# every character of Unicode's control (Cc), format (Cf) and line / paragraph separator (Zl, Zp) categories but the
# zero-width non-joiner and joiner, which Persian and Indic words and emoji sequences are written with
WRITTEN_FORMAT = "\u200c\u200d"
CONTROLS = [chr(c) for c in range(0x110000)
            if unicodedata.category(chr(c)) in ("Cc", "Cf", "Zl", "Zp") and chr(c) not in WRITTEN_FORMAT]
# a name's characters: ASCII, accented and wide letters (2-4 bytes in UTF-8), joiners, and an unseen one now and then
NAME_CHARS = st.one_of(st.sampled_from("abcxyz019_-."), st.sampled_from("éü漢字🙂می" + WRITTEN_FORMAT),
                       st.sampled_from(CONTROLS))


@st.composite
def path_values(draw):
    """(a path, what is wrong with its form or None): names of 1 to 300 characters joined by '/'."""
    names = draw(st.lists(st.one_of(st.text(NAME_CHARS, min_size=1, max_size=12),
                                    st.text(st.sampled_from("ab漢"), min_size=80, max_size=300)),
                          min_size=1, max_size=draw(st.sampled_from([3, 40]))))
    value = draw(st.sampled_from(["", "/tmp/", "~/"])) + "/".join(names)
    encoded = os.fsencode(os.path.expanduser(value))
    if any(char in CONTROLS for char in value):
        return value, "control"
    if len(encoded) > PATH_MAX_BYTES:
        return value, "long path"
    if any(len(part) > NAME_MAX_BYTES for part in encoded.split(b"/")):
        return value, "long name"
    return value, None


@settings(max_examples=200, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(key=st.sampled_from(path_keys()), case=path_values())
def test_a_path_of_an_impossible_form_is_refused_naming_the_key(key, case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative path looks here (nothing of these names exists)
    value, fault = case
    overrides = {key: value}
    try:
        load_config(overrides=overrides)
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(f"{key}: "), message
        if not value.strip():  # blank ('\t', '\n'): refused as naming nothing, by the rule for every text setting
            assert "non-empty text" in message, message
        elif fault is not None:
            assert "a path" in message and ("control" in message) == (fault == "control"), (fault, message)
        else:  # a legal form: refused, if at all, for something else (no such model directory, no data file)
            assert "control characters" not in message and "the system's bound" not in message, message
        return
    except OSError as exc:  # the look for the file, past the file system's bounds: what the form check prevents
        raise AssertionError(f"{key}={value!r} reached the file system: {exc}") from None
    assert fault is None, f"{key}={value!r} was taken with {fault}"


class _WorkStarted(Exception):
    """The command accepted its arguments and began its work."""


# The paths the command line takes that are no config key: each command's arguments before the path, and the work
# it starts once they are accepted (replaced here by a sentinel).
CLI_PATHS = {"--config": (["train", "--config"], None),
             "plot run_dir": (["plot"], ("grpo_engine.state.plot", "plot_run")),
             "plot --output": (["plot", ".", "--output"], ("grpo_engine.state.plot", "plot_run")),
             "eval --output": (["eval", "--model", "org/name", "--output"], ("grpo_engine.tools.evaluate", "run_eval"))}


@settings(max_examples=100, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(where=st.sampled_from(sorted(CLI_PATHS)), case=path_values())
def test_a_command_line_path_of_an_impossible_form_is_one_line_naming_its_argument(where, case, tmp_path, monkeypatch,
                                                                                    capsys):
    import importlib

    from grpo_engine.cli import main

    monkeypatch.chdir(tmp_path)
    value, fault = case
    argv, work = CLI_PATHS[where]

    def started(*args, **kwargs):
        raise _WorkStarted

    if work is not None:
        monkeypatch.setattr(importlib.import_module(work[0]), work[1], started)
    # A value starting with '-' is written as a user must write it (argparse reads it as an option otherwise, which
    # test_a_value_read_as_an_option_is_named covers): after '--' for RUN_DIR, joined by '=' to its flag.
    command = [*argv, value] if not value.startswith("-") else \
        [*argv, "--", value] if not argv[-1].startswith("--") else [*argv[:-1], f"{argv[-1]}={value}"]
    try:
        outcome = str(main(command))
    except _WorkStarted:
        outcome = "accepted"
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("note: ")]
    assert "Traceback" not in err and "OSError" not in err and "Errno" not in err, err
    if fault is None:  # a legal form: taken, or refused for something else (no such config file, run directory)
        assert "control characters" not in err and "the system's bound" not in err, err
        return
    assert outcome in ("1", "2") and len(lines) == 1, (outcome, err)
    # --config: the command line's length check names the flag, the config reader's form check the config file
    named = ("--config", "config file") if where == "--config" else (where.split()[-1],)
    assert any(name in lines[0] for name in named) and "expected a path" in lines[0], (where, lines)


@settings(max_examples=30, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.text(min_size=1, max_size=12).map(lambda text: "-" + text.lstrip("-")).filter(
    lambda text: len(text) > 1 and not text.startswith("-h") and " " not in text  # -hX: -h with X attached
    and not re.fullmatch(r"-\d+|-\d*\.\d+", text)))  # argparse reads those as values (a space, a negative number)
def test_a_value_read_as_an_option_is_named(value, capsys):
    # `plot -runs`: argparse takes '-runs' for an option and then misses RUN_DIR; the line names both, and the way
    # to pass such a value
    from grpo_engine.cli import main

    capsys.readouterr()
    assert main(["plot", value]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "required: run_dir" in err, err
    assert "was read as an option" in err and "grpo-engine plot -- VALUE" in err, err


@settings(max_examples=20, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from([["train"], ["eval", "--model", "org/name"]]),
       blank=st.text(st.sampled_from(" \t\n\u00a0\u3000"), max_size=3))
def test_a_blank_config_path_is_one_line_naming_it(command, blank, tmp_path, monkeypatch, capsys):
    """`--config ""` (a variable left unset in a script) was read as the path '.', "config file '.' is a
    directory"; it is refused as blank text, as every text setting is."""
    from grpo_engine.cli import main

    monkeypatch.chdir(tmp_path)
    assert main([*command, "--config", blank]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and f"config file {blank!r}: expected the path of a YAML file" in lines[0], lines


# A user name no system has: letters a person types, prefixed so that no account of the test machine matches.
NO_USER = st.from_regex(r"nouser[a-z0-9_]{1,12}", fullmatch=True)
REST = st.lists(st.text(st.sampled_from("abc_.9漢"), min_size=1, max_size=8), max_size=3).map(
    lambda names: "".join("/" + name for name in names))


@settings(max_examples=60, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(path_keys()), user=NO_USER, rest=REST)
def test_a_home_of_no_user_is_refused_naming_the_key(key, user, rest, tmp_path, monkeypatch):
    # `~nosuchuser/x`: expanduser leaves it as written; pathlib then raised "RuntimeError: Could not determine home
    # directory." naming nothing, and a run directory was refused as "a symbolic link that leads back to itself?"
    monkeypatch.chdir(tmp_path)
    try:
        load_config(overrides={key: f"~{user}{rest}"})
    except ConfigError as exc:
        assert str(exc).startswith(f"{key}: expected a path whose leading ~{user} names a home directory"), str(exc)
        return
    raise AssertionError(f"{key}=~{user}{rest} was taken")


@settings(max_examples=40, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.sampled_from(sorted(CLI_PATHS)), user=NO_USER, rest=REST)
def test_a_command_line_home_of_no_user_is_one_line_naming_its_argument(where, user, rest, tmp_path, monkeypatch,
                                                                        capsys):
    from grpo_engine.cli import main

    monkeypatch.chdir(tmp_path)
    argv, _ = CLI_PATHS[where]
    assert main([*argv, f"~{user}{rest}"]) == 2  # refused by the parser, before any work: nothing to replace
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and where.split()[-1] in lines[0] and f"leading ~{user} names a home" in lines[0], lines


def test_a_file_named_like_a_home_is_taken_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "~nouserfile").mkdir()
    assert load_config(overrides={"run.output_dir": "~nouserfile/run"}).run.output_dir == "~nouserfile/run"
