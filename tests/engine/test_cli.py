"""`grpo-engine` as a user runs it: a subprocess, exit codes, messages."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SMALL = ["--run.max_steps", "2", "--run.warm_start_steps", "3", "--run.progress_bar", "false",
         "--data.builtin_max_operand", "2", "--rollout.num_generations", "4", "--rollout.max_new_tokens", "6",
         "--optim.per_device_train_batch_size", "8", "--run.log_completions_steps", "0"]


def grpo_engine(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    result = grpo_engine("train", "--output-dir", str(run_dir), *SMALL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "reward: " in result.stdout and "accuracy on the 9 evaluation prompts" in result.stdout
    return run_dir


def test_train_writes_a_run_directory(trained_run):
    for name in ("metrics.jsonl", "samples.jsonl", "curves.png", "config.yaml", "base_model/config.json",
                 "checkpoints/checkpoint-000002/model/model.safetensors"):
        assert (trained_run / name).is_file(), name


def test_eval_and_plot_subcommands(trained_run, tmp_path):
    model = trained_run / "checkpoints" / "checkpoint-000002" / "model"
    result = grpo_engine("eval", "--model", str(model), "--data.builtin_max_operand", "2", "--num-samples", "4",
                         "--output", str(tmp_path / "eval.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "eval.json").read_text())
    assert metrics["num_prompts"] == 9 and 0.0 <= metrics["pass@1"] <= metrics["pass@4"] <= 1.0
    result = grpo_engine("plot", str(trained_run), "--output", str(tmp_path / "c.png"))
    assert result.returncode == 0 and (tmp_path / "c.png").stat().st_size > 0


def test_eval_on_the_gsm8k_example(trained_run):
    model = trained_run / "checkpoints" / "checkpoint-000002" / "model"
    result = grpo_engine("eval", "--model", str(model), "--data", "examples/gsm8k_sample.jsonl",
                         "--data.prompt_column", "question", "--data.system_prompt", "Answer in \\boxed{}.",
                         "--rollout.max_new_tokens", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["num_prompts"] == 12


def test_a_config_error_exits_2_with_the_key():
    result = grpo_engine("train", "--loss.loss_type", "ppo")
    assert result.returncode == 2
    assert "config error: loss.loss_type: must be one of" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args, code, message", [
    (["train", "--optim.per_device_train_batch_size", "6", "--rollout.num_generations", "4",
      "--run.warm_start_steps", "0"], 2, "must be divisible by rollout.num_generations"),
    (["eval", "--model", "/no/such/model"], 1, "model path '/no/such/model' is not a directory"),
    (["plot", "/no/such/run"], 1, "metrics.jsonl does not exist"),
])
def test_errors_name_their_cause(args, code, message, capsys, tmp_path):
    from engine.cli import main

    if args[0] == "train":
        args = [*args, "--run.output_dir", str(tmp_path / "run")]
    assert main(args) == code
    assert message in capsys.readouterr().err


def test_unknown_flag_is_rejected(capsys):
    from engine.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["train", "--run.max_stepz", "3"])
    assert exc.value.code == 2 and "unrecognized arguments: --run.max_stepz" in capsys.readouterr().err
