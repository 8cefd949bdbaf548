"""The config files' YAML: strict (a key given twice is refused naming the line), YAML 1.2 scalars, and the
saved config.yaml reads back equal."""

import pytest

from grpo_engine.config import ConfigError, config_from_yaml, config_yaml, load_config, parse_yaml
from grpo_engine.config.strict_yaml import read_yaml


def test_a_section_given_twice_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  learning_rate: 1.0e-5\nrun:\n  max_steps: 3\noptim:\n  learning_rate: 1.0e-6\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(refused.value) == (f"config file {str(path)!r} line 5: key 'optim' given twice in one mapping "
                                  f"(first on line 1)")


def test_a_key_given_twice_in_a_section_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("run:\n  max_steps: 3\n  seed: 1\n  max_steps: 4\n")
    with pytest.raises(ConfigError, match="line 4: key 'max_steps' given twice in one mapping \\(first on line 2\\)"):
        load_config(path)


@pytest.mark.parametrize("text, value", [
    ("1e-5", 1e-5),  # YAML 1.1 (PyYAML's safe loader) reads a string
    ("yes", "yes"),  # YAML 1.1: true
    ("off", "off"),  # YAML 1.1: false
    ("017", 17),  # YAML 1.1: octal 15
    ("1_000", "1_000"),  # YAML 1.1: 1000
    ("2024-01-01", "2024-01-01"),  # YAML 1.1: a date
    ("true", True), ("null", None), ("~", None), ("", None), ("-.inf", float("-inf")), ("[a, 'b']", ["a", "b"]),
])
def test_scalars_read_as_yaml_1_2(text, value):
    assert parse_yaml(f"key: {text}\n", "test") == {"key": value}


def test_a_syntax_error_is_one_line_with_its_line_number(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("run:\n  max_steps: [3\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    message = str(refused.value)
    assert message.startswith(f"config file {str(path)!r} line 3: ") and "\n" not in message


def test_a_file_that_is_not_a_mapping_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("- run\n- optim\n")
    with pytest.raises(ConfigError, match="must hold a mapping of sections, got list"):
        load_config(path)


def test_the_saved_config_reads_back_equal():
    config = load_config(overrides={"data.system_prompt": "yes", "data.split": "1e5", "rollout.temperature": 0.7,
                                    "run.report_to": ["wandb"], "model.lora.target_modules": ["q_proj", "v_proj"],
                                    "optim.learning_rate": 3e-7, "data.eval_split": "null", "data.config": "017",
                                    "data.prompt_column": "a\x85b\u2028c", "rewards.answer_column": "你好"})
    text = config_yaml(config)
    assert config_from_yaml(text, "config.yaml") == config
    assert "temperature: 0.7" in text and "data.system_prompt" not in text


@pytest.mark.parametrize("text, line", [
    ("base: &b {seed: 1}\nrun:\n  <<: *b\n", 3),
    ("base: &b {seed: 1}\nrun: {<<: *b, max_steps: 2}\n", 2),
    ("a: &a {seed: 1}\nb: &b {max_steps: 2}\nrun:\n  <<: [*a, *b]\n", 4),
    ("x: &x {run: {seed: 1}}\n<<: *x\n", 2),
])
def test_a_yaml_merge_key_is_named_with_its_line(tmp_path, text, line):
    """YAML 1.1's merge key (`<<: *anchor`) is not part of the dialect: one line saying so, where it was read as a
    key named '<<' ("unknown key 'run.<<'")."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"line {line}: a merge key \\(<<: \\*anchor\\) is not read"):
        read_yaml(path)
