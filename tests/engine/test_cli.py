"""`grpo-engine` as a user runs it: a subprocess, exit codes, messages."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repo_paths import ROOT, SUPPORT
SMALL = ["--run.max_steps", "2", "--run.warm_start_steps", "3", "--run.progress_bar", "false",
         "--data.builtin_max_operand", "2", "--rollout.num_generations", "4", "--rollout.max_new_tokens", "6",
         "--optim.per_device_train_batch_size", "8", "--run.log_completions_steps", "0"]


ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")


def grpo_engine(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grpo_engine", *args], capture_output=True, text=True, timeout=timeout,
                          env=ENV, cwd=ROOT)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    result = grpo_engine("train", "--output-dir", str(run_dir), *SMALL, "--run.progress_bar", "true",
                         "--run.save_steps", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "reward: " in result.stdout and "accuracy on the 9 evaluation prompts" in result.stdout
    # The training bar is the only one: transformers' loading / saving bars would break it up.
    assert "grpo: 100%" in result.stderr
    assert "Writing model shards" not in result.stderr and "Loading weights" not in result.stderr
    return run_dir


@pytest.mark.slow
def test_train_writes_a_run_directory(trained_run):
    for name in ("metrics.jsonl", "samples.jsonl", "curves.png", "config.yaml", "base_model/config.json",
                 "checkpoints/checkpoint-000002/model/model.safetensors"):
        assert (trained_run / name).is_file(), name


@pytest.mark.slow
def test_the_same_command_again_reports_the_finished_run_and_resume_trains_it_on(trained_run, tmp_path, capsys):
    from grpo_engine.cli import main
    from grpo_engine.state import checkpoint as ckpt

    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    metrics = (run_dir / "metrics.jsonl").read_text()
    assert main(["train", "--output-dir", str(run_dir), *SMALL]) == 0
    out = capsys.readouterr().out
    assert f"{run_dir} holds this run, finished: step 2 of 2 (checkpoint-000002)" in out
    assert "reward: " in out and "accuracy on the 9 evaluation prompts" in out
    assert "--resume --run.max_steps N (N > 2)" in out
    assert (run_dir / "metrics.jsonl").read_text() == metrics  # nothing trained, nothing written
    # More steps without --resume: said how, nothing done.
    assert main(["train", "--output-dir", str(run_dir), *SMALL, "--run.max_steps", "3"]) == 1
    assert "finished at step 2: add --resume to train it on to step 3" in capsys.readouterr().err
    # Other options: another run, which belongs in another directory.
    assert main(["train", "--output-dir", str(run_dir), *SMALL, "--run.seed", "7"]) == 1
    assert "holds a finished run with other options: run.seed (saved 0, now 7)" in capsys.readouterr().err
    assert main(["train", "--output-dir", str(run_dir), *SMALL, "--run.max_steps", "3", "--resume"]) == 0
    assert [p.name for p in ckpt.list_checkpoints(run_dir)][-1] == "checkpoint-000003"
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if "reward" in json.loads(line)] == [1, 2, 3]


@pytest.mark.slow
def test_eval_and_plot_subcommands(trained_run, tmp_path):
    model = trained_run / "checkpoints" / "checkpoint-000002" / "model"
    result = grpo_engine("eval", "--model", str(model), "--data.builtin_max_operand", "2", "--num-samples", "4",
                         "--output", str(tmp_path / "eval.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "eval.json").read_text())
    assert metrics["num_prompts"] == 9 and 0.0 <= metrics["pass@1"] <= metrics["pass@4"] <= 1.0
    result = grpo_engine("plot", str(trained_run), "--output", str(tmp_path / "c.png"))
    assert result.returncode == 0 and (tmp_path / "c.png").stat().st_size > 0


@pytest.mark.slow
def test_eval_on_the_gsm8k_example(trained_run):
    model = trained_run / "checkpoints" / "checkpoint-000002" / "model"
    result = grpo_engine("eval", "--model", str(model), "--data", "examples/gsm8k_sample.jsonl",
                         "--data.prompt_column", "question", "--data.system_prompt", "Answer in \\boxed{}.",
                         "--rollout.max_new_tokens", "4", "--data.max_prompt_length", "120")  # 128 positions
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["num_prompts"] == 12


def test_a_config_error_exits_2_with_the_key():
    result = grpo_engine("train", "--loss.loss_type", "ppo")
    assert result.returncode == 2
    assert "config error: loss.loss_type: expected one of" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args, code, message", [
    (["train", "--optim.per_device_train_batch_size", "6", "--rollout.num_generations", "4",
      "--run.warm_start_steps", "0"], 2, "must be divisible by rollout.num_generations"),
    (["eval", "--model", "/no/such/model"], 2, "model.name_or_path: expected a local model directory or a Hub id ORG/NAME, got '/no/such/model'"),
    (["train", "--rollout.temperature", "0"], 2, "rollout.temperature: expected a value >= 1e-30, got 0"),
    (["train", "--optim.learning_rate", "-1e-5"], 2, "optim.learning_rate: expected a value >= 0.0, got -1e-05"),  # it parsed
    (["plot", "/no/such/run"], 1, "metrics.jsonl does not exist"),
])
def test_errors_name_their_cause(args, code, message, capsys, tmp_path):
    from grpo_engine.cli import main

    if args[0] == "train":
        args = [*args, "--run.output_dir", str(tmp_path / "run")]
    assert main(args) == code
    assert message in capsys.readouterr().err


def test_unknown_flag_is_rejected(capsys):
    from grpo_engine.cli import main

    assert main(["train", "--run.max_stepz", "3"]) == 2
    assert "unknown flag --run.max_stepz (did you mean --run.max_steps?)" in capsys.readouterr().err


def test_abbreviated_flags_are_rejected(capsys):
    from grpo_engine.cli import main

    assert main(["train", "--optim.learning_rat", "1e-5"]) == 2
    assert "unknown flag --optim.learning_rat (did you mean --optim.learning_rate?)" in capsys.readouterr().err


def test_help_gives_each_key_a_meaning_and_its_default(capsys):
    from grpo_engine.cli import main
    from grpo_engine.config import key_help

    assert not [key for key, text in key_help().items() if text.startswith("(default")]  # every key explained
    with pytest.raises(SystemExit) as exc:
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert exc.value.code == 0
    assert "--optim.learning_rate VALUE AdamW's peak learning rate (default: 1e-06)" in text
    assert "--loss.beta VALUE KL coefficient against the starting model (0: no reference model) (default: 0.0)" in text
    assert "--run.save_on_interrupt VALUE Ctrl-C / SIGTERM: finish the step in progress" in text


def test_eval_model_flag_overrides_the_yaml(tiny_model_dir, tmp_path, capsys):
    from grpo_engine.cli import main

    config = tmp_path / "c.yaml"
    config.write_text("model:\n  name_or_path: /no/such/model\n")
    assert main(["eval", "--config", str(config), "--model", str(tiny_model_dir),
                 "--data.builtin_max_operand", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["num_prompts"] == 9


@pytest.mark.parametrize("keep, message", [
    (("config.json", "model.safetensors"), "has no tokenizer files"),
    ((), "is empty"),
])
def test_incomplete_model_directories_are_named(keep, message, tiny_model_dir, tmp_path, capsys):
    from grpo_engine.cli import main

    model = tmp_path / "model"
    model.mkdir()
    for name in keep:
        shutil.copy(tiny_model_dir / name, model / name)
    assert main(["eval", "--model", str(model)]) == 1
    assert f"model directory {str(model)!r} {message}" in capsys.readouterr().err
    assert main(["train", "--model", str(model), "--output-dir", str(tmp_path / "run")]) == 1
    assert f"model directory {str(model)!r} {message}" in capsys.readouterr().err


@pytest.mark.slow
def test_a_raising_reward_function_shows_its_own_traceback(monkeypatch, tmp_path, capsys):
    from grpo_engine.cli import main

    monkeypatch.syspath_prepend(str(SUPPORT))
    code = main(["train", "--output-dir", str(tmp_path / "run"), *SMALL,
                 "--rewards.functions", "[user_rewards:raises_inside_helper]"])
    err = capsys.readouterr().err
    assert code == 1
    traceback, last = err.rstrip().rsplit("\n", 1)
    assert traceback.startswith("Traceback") and "in _score_one" in traceback and "KeyError" in traceback
    assert "grpo_engine/steps/rewards.py" not in traceback  # the user's frames only
    assert last.startswith("grpo-engine train: RewardFunctionError: reward function 'raises_inside_helper' raised")


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_at_the_step_boundary_and_hints_resume(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = ["train", "--output-dir", str(run_dir), *SMALL, "--run.progress_bar", "true", "--run.max_steps", "1000"]
    process = subprocess.Popen([sys.executable, "-m", "grpo_engine", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 150
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 2):
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()[-3000:]
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=150)
    assert process.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("grpo-engine train: SIGINT: stopped after step ") and "--resume" in last
    step = int(last.split("stopped after step ")[1].split(",")[0])
    from grpo_engine.state import checkpoint as ckpt

    assert [p.name for p in ckpt.list_checkpoints(run_dir)] == [f"checkpoint-{step:06d}"]
    logged = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert logged[-1] == step

    from grpo_engine.cli import main

    assert main([*args[:-1], str(step + 1), "--resume"]) == 0  # in this process: one interpreter start less
    assert f"checkpoint-{step:06d} at step {step} of {step + 1}" in capsys.readouterr().out
