"""`--model.tensor_parallel 2` under torchrun (2 gloo processes on CPU): the demo task trains the demo's model
(saved with an even vocabulary: tests/engine/conftest.py) sharded by transformers' tensor-parallel plan and
gives the rewards, loss and metrics of a 1-process run with the same seed; it resumes from its checkpoint, whose
whole weights load without TP. Bad combinations are refused."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import GPT2Config

from grpo_engine.config import ConfigError, ModelConfig, load_config
from grpo_engine.model.loading import ModelLoadError, load_causal_lm
from grpo_engine.model.tensor_parallel import check_tensor_parallel
from grpo_engine.run_setup import setup_run
from grpo_engine.state.checkpoint import CheckpointError, load_training_state
from grpo_engine.tools.evaluate import run_eval
from processes import subprocess_env, torchrun
from repo_paths import ROOT

FLAGS = ["--run.save_steps", "1", "--run.progress_bar", "false", "--run.plot", "false", "--run.warm_start_steps",
         "0", "--run.log_completions_steps", "0", "--data.builtin_max_operand", "2", "--rollout.num_generations",
         "4", "--rollout.max_new_tokens", "8", "--optim.per_device_train_batch_size", "8",
         "--optim.learning_rate", "1e-4", "--loss.beta", "0.04",
         # digits vary between a random model's completions, so every step has advantages and a real gradient
         # (on a step without any, AdamW would blow TP's rounding noise up to a full-size update)
         "--rewards.functions", "[math_accuracy, user_rewards:reward_short_digits]",
         # pinned against the demo preset: one optimizer pass per batch at a constant LR (TP with
         # num_iterations > 1 is not compared here: see docs/engine.md)
         "--optim.num_iterations", "1", "--optim.lr_scheduler_type", "constant", "--optim.warmup_ratio", "0"]
EXACT = ("reward", "reward_std", "num_tokens", "completions/mean_length", "frac_reward_zero_std")
CLOSE = ("loss", "grad_norm", "entropy", "kl", "clip_ratio/region_mean")


def _train(command: list[str], run_dir: Path, steps: int, *extra: str) -> list[dict]:
    result = subprocess.run([*command, "-m", "grpo_engine", "train", "--run.output_dir", str(run_dir),
                             "--run.max_steps", str(steps), *FLAGS, *extra], env=subprocess_env(), timeout=180,
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "reward" in row]


@pytest.mark.slow
def test_tensor_parallel_run_matches_one_process_and_resumes(tmp_path, tensor_parallel_model_dir):
    one_dir, tp_dir = tmp_path / "one", tmp_path / "tp"
    model = ("--model.name_or_path", str(tensor_parallel_model_dir))  # the demo's model, with an even vocabulary
    single = _train([sys.executable], one_dir, 3, *model)
    tensor_parallel = _train(torchrun(), tp_dir, 2, *model, "--model.tensor_parallel", "2")
    resumed = _train(torchrun(), tp_dir, 3, *model, "--model.tensor_parallel", "2", "--run.resume", "latest")
    assert [row["step"] for row in resumed] == [1, 2, 3]  # the resumed run appends step 3 to steps 1-2
    assert any(row["grad_norm"] > 0 for row in single)  # the comparison covers real updates
    for one, two in zip(single, resumed, strict=True):
        for name in EXACT:
            assert two[name] == one[name], (one["step"], name)
        for name in CLOSE:
            assert two[name] == pytest.approx(one[name], rel=1e-3, abs=1e-6), (one["step"], name)
    assert resumed[:2] == tensor_parallel

    final = "checkpoints/checkpoint-000003/model"
    whole, sharded = load_file(one_dir / final / "model.safetensors"), load_file(tp_dir / final / "model.safetensors")
    # transformers' tensor-parallel save also writes the tied LM head; loading ties it to the embedding again
    assert set(whole) <= set(sharded) and set(sharded) - set(whole) <= {"lm_head.weight"}
    for name in whole:  # the TP checkpoint holds whole (gathered) weights
        torch.testing.assert_close(sharded[name], whole[name], atol=1e-4, rtol=1e-3, msg=name)
    config = load_config(overrides={"rollout.max_new_tokens": 8, "data.builtin_max_operand": 2})
    metrics = run_eval(config, str(tp_dir / final), num_samples=1, greedy=True, batch_size=16)
    assert metrics["num_prompts"] == 9 and 0.0 <= metrics["accuracy"] <= 1.0


@pytest.mark.slow
def test_a_tensor_parallel_bfloat16_run_resumes_its_float32_copies_exactly(tmp_path, tensor_parallel_model_dir):
    """optim.master_weights auto with model.dtype bfloat16: each rank's float32 copies (its shards) are saved in
    its optimizer file and restored in float32, so the resumed step 3 is the uninterrupted one's."""
    straight_dir, stopped_dir = tmp_path / "straight", tmp_path / "stopped"
    flags = ("--model.name_or_path", str(tensor_parallel_model_dir), "--model.tensor_parallel", "2",
             "--model.dtype", "bfloat16")
    straight = _train(torchrun(), straight_dir, 3, *flags)
    _train(torchrun(), stopped_dir, 2, *flags)
    resumed = _train(torchrun(), stopped_dir, 3, *flags, "--run.resume", "latest")
    for one, two in zip(straight, resumed, strict=True):  # every measured value but times and memory, exactly
        assert [two[name] for name in (*EXACT, *CLOSE)] == [one[name] for name in (*EXACT, *CLOSE)], one["step"]
    # the weights: rounded from copies that a resume restored in float32 (rounded to bfloat16 on the way, a copy
    # would lose the steps it held below the weights' spacing)
    final = "checkpoints/checkpoint-000003/model/model.safetensors"
    a, b = load_file(straight_dir / final), load_file(stopped_dir / final)
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def test_training_refuses_more_tensor_parallel_ranks_than_processes(tmp_path):
    config = load_config(overrides={"model.tensor_parallel": 2, "run.output_dir": str(tmp_path / "run")})
    with pytest.raises(ConfigError, match=r"model.tensor_parallel is 2 but the run has 1 process"):
        setup_run(config)
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_refuses_tensor_parallel_other_than_the_number_of_processes():
    config = load_config(overrides={"model.tensor_parallel": 2})
    with pytest.raises(ConfigError, match=r"model.tensor_parallel is 2 but the run has 4 .*pure tensor parallel"):
        check_tensor_parallel(config, 4)
    with pytest.raises(ConfigError, match="model.tensor_parallel: expected a value >= 1, got 0"):
        load_config(overrides={"model.tensor_parallel": 0})
    check_tensor_parallel(config, 2)
    check_tensor_parallel(load_config(), 3)  # 1: plain data parallelism on any number of processes


def test_refuses_tensor_parallel_with_lora():
    with pytest.raises(ConfigError, match="model.tensor_parallel > 1 does not support model.lora.enabled"):
        load_config(overrides={"model.tensor_parallel": 2, "model.lora.enabled": True})


def test_refuses_a_model_without_a_tensor_parallel_plan(tmp_path):
    GPT2Config(n_layer=1, n_embd=8, n_head=2).save_pretrained(tmp_path)  # GPT-2 ships no tp plan
    with pytest.raises(ModelLoadError, match="model.tensor_parallel > 1 needs a model with a tensor-parallel plan"):
        load_causal_lm(str(tmp_path), ModelConfig(), torch.device("cpu"), tensor_parallel=2)


def test_resume_refuses_a_checkpoint_without_this_ranks_optimizer_shard(tmp_path):
    from saved_states import trained_states, write_states

    write_states(tmp_path, trained_states())
    assert load_training_state(tmp_path, 0)["trainer"]["step"] == 1
    with pytest.raises(CheckpointError, match="no optimizer-tp1.pt: it was saved with another model.tensor_parallel"):
        load_training_state(tmp_path, 0, optimizer_shard=1)
