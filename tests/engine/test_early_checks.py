"""What can be checked before the model loads is checked then: bad data files and reward functions that
read a column the data lacks stop `train` and `eval` with one line, before any model is built or loaded."""

import json
from pathlib import Path

import pytest

from grpo_engine.resource_limits import usable_cpus
from repo_paths import SUPPORT


def _no_model(*args, **kwargs):
    raise AssertionError("a model was built or loaded before the data was checked")


@pytest.fixture()
def no_model(monkeypatch):
    from grpo_engine.tools import evaluate
    from grpo_engine import run_setup

    monkeypatch.setattr(run_setup, "_builtin_base_model", _no_model)  # the demo model and its warm start
    monkeypatch.setattr(run_setup, "load_causal_lm", _no_model)
    monkeypatch.setattr(evaluate, "load_eval_model", _no_model)
    monkeypatch.syspath_prepend(str(SUPPORT))


def _jsonl(path: Path, rows: list) -> str:
    path.write_text("\n".join(row if isinstance(row, str) else json.dumps(row) for row in rows) + "\n")
    return str(path)


BAD_FILES = {
    "malformed line": ([{"prompt": "1+1=", "answer": "2"}, '{"prompt": "2+2=", "answer": '], [],
                       "{path}:2: invalid JSON"),
    "no answer column": ([{"prompt": "1+1=", "solution": "2"}], [],
                         "dataset '{path}' has no 'answer' column, which reward function 'math_accuracy' reads"),
    "a user reward's column": ([{"prompt": "1+1=", "answer": "2"}], ["--rewards.functions",
                                                                     "[user_rewards:by_difficulty]"],
                               "dataset '{path}' has no 'difficulty' column, which reward function "
                               "'by_difficulty' reads"),
    "runaway prompt": ([{"prompt": "1+1=", "answer": "2"}, {"prompt": "7" * 100_001, "answer": "7"}], [],
                       "dataset '{path}' row 1: the prompt has 100,001 characters"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
@pytest.mark.parametrize("command", ["train", "eval"])
def test_bad_data_stops_before_the_model_loads_with_one_line(case, command, no_model, tiny_model_dir, tmp_path,
                                                             capsys):
    from grpo_engine.cli import main

    rows, flags, message = BAD_FILES[case]
    path = _jsonl(tmp_path / "data.jsonl", rows)
    if command == "train":  # the built-in model, whose warm start would run first
        args = ["train", "--data", path, "--output-dir", str(tmp_path / "run"), "--run.progress_bar", "false"]
    else:
        args = ["eval", "--model", str(tiny_model_dir), "--data", path]
    assert main([*args, *flags]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"grpo-engine {command}: ") and message.format(path=path) in err


def test_the_evaluation_file_is_checked_too(no_model, tmp_path):
    from grpo_engine.config import load_config
    from grpo_engine.steps.rewards import RewardFunctionError
    from grpo_engine.trainer import train

    train_path = _jsonl(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    eval_path = _jsonl(tmp_path / "eval.jsonl", [{"prompt": "1+2="}])
    config = load_config(overrides={"data.path": train_path, "data.eval_path": eval_path,
                                    "run.output_dir": str(tmp_path / "run")})
    with pytest.raises(RewardFunctionError, match=f"dataset '{eval_path}' has no 'answer' column"):
        train(config)
    assert not (tmp_path / "run").exists()  # nothing written either


MACHINE_LIMITS = {
    # what the machine cannot run, said before the data, the rewards or the demo's warm start
    "no CUDA device": (["--run.device", "cuda"], "run.device is cuda but this machine has no CUDA device"),
    "flash-attn on a CPU": (["--model.attn_implementation", "flash_attention_2", "--run.device", "cpu"],
                            "model.attn_implementation flash_attention_2 runs on CUDA GPUs only"),
    # more threads than CPUs only oversubscribe them; 100000 crashed OpenMP (a segmentation fault, no message)
    "a thread per CPU at most": (["--run.num_threads", str(usable_cpus() + 1)],
                                 f"run.num_threads: expected at most the {usable_cpus()} CPU"),
    "threads in the thousands": (["--run.num_threads", "100000"], "this process may run on, got 100000"),
}


@pytest.mark.parametrize("case", list(MACHINE_LIMITS))
def test_what_this_machine_cannot_run_stops_before_anything_loads(case, no_model, tmp_path, capsys, monkeypatch):
    import torch

    from grpo_engine.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    flags, message = MACHINE_LIMITS[case]
    assert main(["train", "--output-dir", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "run").exists()


def test_flash_attention_without_its_package_is_named(monkeypatch):
    import importlib.util

    import torch

    from grpo_engine.config import ConfigError, ModelConfig
    from grpo_engine.model.loading import check_attention

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real_find_spec(name, *a))
    with pytest.raises(ConfigError, match="needs the flash-attn package"):
        check_attention(ModelConfig(attn_implementation="flash_attention_2"), torch.device("cuda"))
    check_attention(ModelConfig(attn_implementation="sdpa"), torch.device("cpu"))  # the others need nothing


def test_a_setting_that_changes_nothing_is_said_before_anything_loads(no_model, tmp_path, capsys):
    from grpo_engine.cli import main

    with pytest.raises(AssertionError, match="a model was built"):  # stopped where the model would be built
        main(["train", "--output-dir", str(tmp_path / "run"), "--rollout.server.urls", "[http://10.0.0.2:8000]",
              "--model.lora.r", "8"])
    err = capsys.readouterr().err
    assert ("warning: rollout.server.urls is set (['http://10.0.0.2:8000']) but applies only with rollout.backend "
            "vllm_server: it changes nothing in this run") in err
    assert "warning: model.lora.r is set (8) but applies only with model.lora.enabled true" in err
