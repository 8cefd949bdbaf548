"""`--section.key VALUE`: one flag per key of the schema, its value read as the type of the field it sets."""

import pytest

from grpo_engine.cli import join_flag_values, _overrides, build_parser
from grpo_engine.config import ConfigError, key_help, leaf_keys, load_config


def config_from_flags(*argv: str):
    args = build_parser().parse_args(join_flag_values(["train", *argv]))
    return load_config(overrides=_overrides(args, {"max_steps": "run.max_steps", "model": "model.name_or_path"}))


def test_a_string_key_takes_the_text_as_written():
    # YAML would read "Add." and a comment.
    config = config_from_flags("--data.system_prompt", "Add. #1 rule: box it")
    assert config.data.system_prompt == "Add. #1 rule: box it"
    for text in ("yes", "1e5", "[not a list]", "-be brief", "", "  spaced  ", "{a: 1}", "true"):
        assert config_from_flags("--data.system_prompt", text).data.system_prompt == text


def test_null_unsets_a_key_that_may_be_null_and_is_text_elsewhere():
    assert config_from_flags("--data.max_prompt_length", "null").data.max_prompt_length is None
    assert config_from_flags("--data.system_prompt", "null").data.system_prompt is None
    assert config_from_flags("--data.split", "null").data.split == "null"  # a string key that cannot be null


@pytest.mark.parametrize("flag, text, expected", [
    ("--optim.learning_rate", "1e-5", 1e-5),
    ("--optim.learning_rate", "3", 3.0),
    ("--rewards.math_wrong", "-0.5", -0.5),  # a negative number, not an option
    ("--rewards.math_no_answer", "-2", -2.0),
    ("--run.max_steps", "017", 17),
    ("--run.progress_bar", "false", False),
    ("--rewards.functions", "[math_accuracy, format]", ["math_accuracy", "format"]),
    ("--rewards.functions", "math_accuracy", ["math_accuracy"]),  # one value: a list of one
    ("--rollout.server.urls", "http://host:8000", ["http://host:8000"]),
    ("--model.lora.target_modules", "q_proj", ["q_proj"]),
    ("--rewards.weights", "[1, 0.5]", [1.0, 0.5]),
    ("--model.lora.target_modules", "all-linear", "all-linear"),
    ("--model.lora.target_modules", "[q_proj, v_proj]", ["q_proj", "v_proj"]),
    ("--max-steps", "12", 12),
])
def test_other_keys_read_their_type(flag, text, expected):
    two_rewards = ["--rewards.functions", "[math_accuracy, format]"] if "weights" in flag else []
    config = config_from_flags(flag, text, *two_rewards)
    key = {"--max-steps": "run.max_steps"}.get(flag, flag[2:])
    value = config
    for part in key.split("."):
        value = getattr(value, part)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("flag, text, message", [
    ("--run.max_steps", "5.5", "run.max_steps: expected an integer, got 5.5"),
    ("--run.max_steps", "ten", "run.max_steps: expected an integer, got 'ten'"),
    ("--max-steps", "0", "run.max_steps: expected a value >= 1, got 0"),
    ("--run.progress_bar", "yes", "run.progress_bar: expected true or false, got 'yes'"),
    ("--optim.learning_rate", "nan", "optim.learning_rate: expected a number, got 'nan'"),
    ("--optim.learning_rate", ".nan", "optim.learning_rate: expected a finite number, got nan"),
    ("--rollout.temperature", ".inf", "rollout.temperature: expected a finite number, got inf"),
    ("--rewards.functions", "[math_accuracy", "--rewards.functions line 1: "),
    ("--rewards.functions", "{a: 1}", "rewards.functions: expected a list, got {'a': 1}"),
    ("--run.seed", "-1", "run.seed: expected a value >= 0, got -1"),  # NumPy's seed domain
    ("--run.seed", "4294967296", "run.seed: expected a value <= 4294967295, got 4294967296"),
    ("--loss.beta", "-0.04", "loss.beta: expected a value >= 0"),  # a KL coefficient below 0 rewards drifting
])
def test_a_value_of_another_type_is_refused_naming_the_key(flag, text, message):
    with pytest.raises(ConfigError) as refused:
        config_from_flags(flag, text)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_help_is_the_schemas_description_and_default():
    helps = key_help()
    assert list(helps) == leaf_keys()
    assert not [key for key, text in helps.items() if text.startswith("(default")]  # every key explained
    assert helps["optim.learning_rate"] == "AdamW's peak learning rate (default: 1e-06)"
    assert helps["rewards.functions"].endswith('(default: ["math_accuracy"])')
    assert helps["data.system_prompt"].endswith("(default: null)")
