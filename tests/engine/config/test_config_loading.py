"""A config from its layers (defaults, preset, YAML file, overrides) and the rules checked once it is whole."""

import pytest

from grpo_engine.cli import build_parser
from grpo_engine.config import ConfigError, leaf_keys, load_config, validate
from repo_paths import ROOT


def test_defaults_follow_trl():
    config = load_config()
    assert config.optim.learning_rate == 1e-6
    assert config.rollout.num_generations == 8
    assert config.rollout.max_new_tokens == 256
    assert config.loss.loss_type == "dapo" and config.loss.beta == 0.0 and config.loss.epsilon == 0.2
    assert config.rewards.scale_rewards == "group"
    assert (config.rewards.math_correct, config.rewards.math_wrong, config.rewards.math_no_answer) == (1.0, -1.0, -0.5)


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  learning_rate: 1e-5\nloss:\n  beta: 0.04\nrun:\n  max_steps: 7\n")
    config = load_config(path, {"run.max_steps": 9, "rollout.temperature": 0.7})
    assert config.optim.learning_rate == 1e-5  # a number, as YAML 1.2 reads it (1.1 would read a string)
    assert config.loss.beta == 0.04
    assert config.run.max_steps == 9
    assert config.loss_config().temperature == 0.7  # the loss scores at the sampling temperature


def test_preset_sits_below_yaml_and_flags(tmp_path):
    preset = {"run": {"max_steps": 50, "seed": 3}}
    config = load_config(overrides={"run.max_steps": 5}, preset=preset)
    assert (config.run.max_steps, config.run.seed) == (5, 3)


@pytest.mark.parametrize("overrides, message", [
    ({"run.max_stepz": 3}, "unknown key 'run.max_stepz' (did you mean run.max_steps?)"),
    ({"bogus.x": 1}, "unknown key 'bogus' (valid keys: model, data, rollout, rewards, loss, optim, run)"),
    ({"run.max_steps": "ten"}, "run.max_steps: expected an integer, got 'ten'"),
    ({"run.max_steps": 5.0}, "run.max_steps: expected an integer, got 5.0"),
    ({"run.progress_bar": "yes"}, "run.progress_bar: expected true or false, got 'yes'"),
    ({"loss.loss_type": "ppo"}, "loss.loss_type: expected one of grpo, bnpo, dr_grpo, dapo"),
    ({"rollout.num_generations": 1, "optim.per_device_train_batch_size": 1},
     "rollout.num_generations: expected a value >= 2, got 1"),
    ({"rewards.weights": [1.0, 2.0]}, "rewards.weights has 2 entries for 1 rewards.functions"),
    ({"rewards.weights": [-0.0]}, "rewards.weights are all 0 ([-0.0]): no completion would be preferred"),
    ({"rewards.functions": ["math_accuracy", "length"], "rewards.weights": [0.0, -0.0]}, "rewards.weights are all 0"),
    ({"rewards.timeout_seconds": 1e308}, "rewards.timeout_seconds: expected a value <= 9223372036.0, got 1e+308"),
    ({"loss.temperature": 0.5}, "unknown key 'loss.temperature': the loss scores the completions at the temperature "
                                "they were sampled at: set rollout.temperature"),
    ({"loss.max_completion_length": 64}, "set rollout.max_new_tokens"),
    ({"model.name_or_path": "/no/such/model"},
     "model.name_or_path: expected a local model directory or a Hub id ORG/NAME, got '/no/such/model'"),
    ({"data.path": "/no/such/file.jsonl"}, "data.path: expected an existing file or directory, or a Hub dataset id "
                                           "ORG/NAME, got '/no/such/file.jsonl'"),
    ({"run.report_to": ["mlflow"]}, "run.report_to[0]: expected one of 'tensorboard' or 'wandb', got 'mlflow'"),
    ({"loss.epsilon": -1.0}, "loss.epsilon: expected a value >= 0.0, got -1.0"),
    ({"optim.learning_rate": float("nan")}, "optim.learning_rate: expected a finite number, got nan"),
    ({"rollout.temperature": float("inf")}, "rollout.temperature: expected a finite number, got inf"),
    ({"rollout.top_p": 0.0}, "rollout.top_p: expected a value > 0.0, got 0.0"),
    ({"rewards.functions": ["math_acuracy"]}, "rewards.functions[0]: expected a built-in reward (math_accuracy, "
                                              "format, length) or 'package.module:function', got 'math_acuracy'"),
    ({"rewards.functions": []}, "rewards.functions: expected at least 1 item, got []"),
    ({"run": 5}, "run: expected a mapping of keys, got 5"),
    ({"model.lora.target_modules": 3}, "model.lora.target_modules: expected a string or a list, got 3"),
    ({"loss.params": {"alpha": 1.0}}, "loss.params.alpha: not a hyper-parameter of loss type 'dapo' (it declares "
                                      "none)"),
    ({"loss.delta": 1.0}, "loss.delta: expected a value > 1.0, got 1.0"),
    ({"rollout.vllm.max_model_len": 100}, "rollout.vllm.max_model_len (100) must hold the longest sequence"),
    ({"rollout.vllm.tensor_parallel_size": 2}, "rollout.vllm.tensor_parallel_size must be 1 or model.tensor_parallel"),
    ({"data.builtin_max_operand": 2, "data.builtin_eval_size": 9},
     "data.builtin_eval_size (9) must be below the 9 problems of data.builtin_max_operand=2"),
    ({"rewards.functions": ["length"], "rollout.max_new_tokens": 16},
     "rewards.length_cache (32) must be at most rollout.max_new_tokens (16)"),
])
def test_bad_values_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as refused:
        load_config(overrides=overrides)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_batch_rule_counts_processes():
    config = load_config(overrides={"optim.per_device_train_batch_size": 4})  # 4 x 1 x P must divide by 8
    with pytest.raises(ConfigError, match=r"= 4 completions\) must be divisible by rollout.num_generations \(8\)"):
        validate(config, num_processes=1)
    validate(config, num_processes=2)


def test_dr_grpo_gets_its_normaliser_from_max_new_tokens():
    config = load_config(overrides={"loss.loss_type": "dr_grpo", "rollout.max_new_tokens": 64})
    assert config.loss_config().max_completion_length == 64


def test_missing_yaml_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_every_leaf_key_is_a_cli_flag():
    parser = build_parser()
    args = parser.parse_args(["train", "--loss.beta", "0.04", "--model.lora.enabled", "true"])
    assert getattr(args, "cfg:loss.beta") == "0.04"
    keys = leaf_keys()
    assert "model.lora.r" in keys and "loss.entropy_coef" in keys and "run.resume" in keys and "loss.params" in keys


@pytest.mark.parametrize("name", ["deepseekmath_grpo.yaml", "gsm8k_qwen_lora.yaml", "demo.yaml"])
def test_example_configs_load(name, tmp_path, tiny_model_dir):
    path = ROOT / "examples" / name
    overrides = {} if name == "demo.yaml" else {
        "model.name_or_path": str(tiny_model_dir), "data.path": str(path.parent / "gsm8k_sample.jsonl")}
    config = load_config(path, overrides)
    validate(config, num_processes=1)
    assert config.rollout.num_generations >= 2


def test_demo_yaml_is_the_built_in_preset():
    from grpo_engine.config import read_yaml
    from grpo_engine.data.demo_task import DEMO_PRESET

    assert read_yaml(ROOT / "examples" / "demo.yaml") == DEMO_PRESET


def test_relative_data_paths_in_yaml_are_read_next_to_it(tmp_path, monkeypatch):
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (folder / "c.yaml").write_text("data:\n  path: train.jsonl\n  eval_path: train.jsonl\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config(folder / "c.yaml")
    assert config.data.path == config.data.eval_path == str(folder / "train.jsonl")
    # A flag's relative path is the shell's: relative to the current directory.
    with pytest.raises(ConfigError, match="data.path: expected an existing file .*, got 'train.jsonl'"):
        load_config(folder / "c.yaml", {"data.path": "train.jsonl"})


def test_a_bad_model_path_is_named_before_what_else_is_wrong_with_the_model_settings():
    demo = ROOT / "examples" / "demo.yaml"  # sets run.warm_start_steps (built-in model only)
    with pytest.raises(ConfigError, match="model.name_or_path: expected a local model directory .*, got '/bad/path'"):
        load_config(demo, {"model.name_or_path": "/bad/path"})


@pytest.mark.parametrize("case", ["latin-1 byte", "directory"])
def test_a_config_path_that_is_not_utf8_yaml_text_is_named_with_what_it_is(case, tmp_path):
    if case == "directory":
        path, expected = tmp_path, "is a directory, not a YAML file"
    else:  # a file saved in another encoding: the line of the first byte UTF-8 cannot read
        path = tmp_path / "c.yaml"
        path.write_bytes("run:\n  max_steps: 5\n  output_dir: caf\u00e9\n".encode("latin-1"))
        expected = "line 3: not UTF-8 text (byte 0xe9)"
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(path) in str(refused.value) and expected in str(refused.value)
