"""A mistyped flag gets the nearest of the command's own flags, as a mistyped YAML key gets the nearest key (every
key of the schema, mistyped at random); `train --help` and a refusal say what naming a model changes."""

from __future__ import annotations

import difflib

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import build_parser, main
from grpo_engine.config import leaf_keys, load_config

KEYS = leaf_keys()


@st.composite
def typo(draw) -> tuple[str, str]:
    key = draw(st.sampled_from(KEYS))
    i = draw(st.integers(min_value=0, max_value=len(key) - 1))
    kind = draw(st.sampled_from(["drop", "double", "swap", "replace"]))
    if kind == "drop":
        wrong = key[:i] + key[i + 1:]
    elif kind == "double":
        wrong = key[:i] + key[i] + key[i:]
    elif kind == "swap" and i + 1 < len(key):
        wrong = key[:i] + key[i + 1] + key[i] + key[i + 2:]
    else:
        wrong = key[:i] + draw(st.sampled_from("xqz")) + key[i + 1:]
    return key, wrong


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=typo())
def test_a_mistyped_config_flag_gets_the_nearest_flag(case, capsys):
    key, wrong = case
    if wrong in KEYS or wrong == key:
        return
    capsys.readouterr()
    assert main(["train", f"--{wrong}", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"grpo-engine train: unknown flag --{wrong}"), err
    assert "'5'" not in err  # the flag's own value is not a second complaint
    options = [o for o in build_parser()._subparsers._group_actions[0].choices["train"]._option_string_actions
               if o.startswith("--")]
    suggested = err.split("did you mean ")[1].split("?")[0] if "did you mean" in err else None
    assert suggested is not None, err  # one edit away from a key is always close enough to name one
    assert suggested in options
    ratio = difflib.SequenceMatcher(None, f"--{wrong}", suggested).ratio()
    assert ratio >= difflib.SequenceMatcher(None, f"--{wrong}", f"--{key}").ratio() - 1e-9


@pytest.mark.parametrize("args, expected", [
    (["train", "--run.max_step", "5"], "unknown flag --run.max_step (did you mean --run.max_steps?)"),
    (["train", "--max-step", "5"], "unknown flag --max-step (did you mean --max-steps?)"),
    (["eval", "--model", "m", "--num-sample", "3"], "unknown flag --num-sample (did you mean --num-samples?)"),
    (["train", "stray"], "unexpected value 'stray'"),
])
def test_unknown_arguments_are_one_line_with_the_nearest_flag(args, expected, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err


def test_train_help_says_what_naming_a_model_changes(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "Naming a model drops the demo's preset" in help_text
    assert "rollout.max_new_tokens 256, not the demo's 12" in help_text


def test_a_refusal_naming_a_preset_setting_says_naming_a_model_dropped_it():
    from grpo_engine.run_setup import dropped_preset_note

    named = load_config(overrides={"model.name_or_path": None})
    message = "the built-in task row 3: a prompt of 5 tokens plus rollout.max_new_tokens (256) is 261 positions"
    assert dropped_preset_note(named, message) == ""  # the demo itself: no preset was dropped
    config = named.model_copy(update={"model": named.model.model_copy(update={"name_or_path": "some/model"})})
    note = dropped_preset_note(config, message)
    assert "naming a model (--model) drops the demo's preset: rollout.max_new_tokens is 256, the default, where " \
           "the demo's preset has 12; set --rollout.max_new_tokens VALUE" == note
    assert dropped_preset_note(config, "data.max_prompt_length is too small") == ""  # the preset does not set it
