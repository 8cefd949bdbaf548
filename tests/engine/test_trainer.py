"""The loop end to end on the tiny model: metrics, KL / old log-probs paths, LoRA, failure handling."""

import json
import math
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_engine.config import load_config
from grpo_engine.data.demo_task import addition_problems
from grpo_engine.state import checkpoint as ckpt
from grpo_engine.steps.rewards import RewardFunctionError
from grpo_engine.trainer import train
from repo_paths import SUPPORT

TRL_METRICS = ("reward", "reward_std", "frac_reward_zero_std", "rewards/math_accuracy/mean", "rewards/length/mean",
               "completions/mean_length", "completions/clipped_ratio", "entropy", "clip_ratio/low_mean",
               "clip_ratio/high_mean", "clip_ratio/region_mean", "loss", "grad_norm", "learning_rate", "tokens/s",
               "time/generate", "time/score", "time/logprobs", "time/update", "memory/peak_mb")


def _steps(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "reward" in row]


@pytest.mark.slow
def test_a_few_steps_end_to_end(small_overrides, tmp_path):
    config = load_config(overrides={**small_overrides, "run.plot": True, "run.log_completions_steps": 1,
                                    "run.warm_start_steps": 2})
    summary = train(config)
    run_dir = Path(summary.run_dir)
    steps = _steps(run_dir)
    assert [row["step"] for row in steps] == [1, 2, 3]
    for name in TRL_METRICS:
        assert all(math.isfinite(row[name]) for row in steps), name
    assert "kl" not in steps[0]  # beta = 0: no reference model
    assert any(row["grad_norm"] > 0 for row in steps)
    assert (run_dir / "curves.png").stat().st_size > 0
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 3 * 4 and {"prompt", "completion", "reward"} <= samples[0].keys()
    assert summary.eval_before is not None and summary.eval_after is not None  # values: the test below
    assert ckpt.list_checkpoints(run_dir)[-1].name == "checkpoint-000003"


def _greedy_accuracy(model_dir: Path, rows: list[dict], max_new_tokens: int) -> float:
    """The eval accuracy recomputed without the engine: transformers' greedy `generate` on the saved model, one
    left-padded batch, and a completion is right when its last \\boxed{} holds the row's answer."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lm = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    encoded = tokenizer([row["prompt"] for row in rows], return_tensors="pt", padding=True, padding_side="left",
                        add_special_tokens=False)
    with torch.no_grad():
        output = lm.generate(**encoded, do_sample=False, max_new_tokens=max_new_tokens,
                             pad_token_id=tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(output[:, encoded["input_ids"].shape[1]:], skip_special_tokens=True)
    answers = [re.findall(r"\\boxed\{([^{}]*)\}", text) for text in texts]
    return sum(bool(found) and found[-1] == row["answer"] for found, row in zip(answers, rows)) / len(rows)


@pytest.mark.slow
def test_eval_accuracy_is_what_the_trained_model_answers(small_overrides):
    # A warm start long enough that the greedy answers are partly right, room for "\\boxed{N}" and its EOS, and
    # a learning rate that keeps them through 3 steps: some answers are right, so a scoring error shows.
    config = load_config(overrides={**small_overrides, "run.warm_start_steps": 120, "rollout.max_new_tokens": 12,
                                    "rewards.length_cache": 12, "optim.learning_rate": 1e-4})
    summary = train(config)
    rows, eval_rows = addition_problems(config.data.builtin_max_operand, config.data.builtin_eval_size,
                                        config.run.seed)
    assert eval_rows == rows and len(rows) == 9  # the built-in task evaluates on its 9 training problems
    final = ckpt.list_checkpoints(Path(summary.run_dir))[-1]
    expected = _greedy_accuracy(final / "model", eval_rows, config.rollout.max_new_tokens)
    assert expected > 0, "no greedy answer is right: the comparison below would not test the scoring"
    assert summary.eval_after["accuracy"] == pytest.approx(expected)
    assert summary.eval_after["pass@1"] == pytest.approx(expected)  # greedy: one sample per prompt


@pytest.mark.slow
def test_kl_old_logprobs_and_grad_accumulation(small_overrides):
    config = load_config(overrides={**small_overrides, "loss.beta": 0.04, "optim.num_iterations": 2,
                                    "optim.per_device_train_batch_size": 4, "optim.gradient_accumulation_steps": 2,
                                    "loss.loss_type": "grpo", "optim.warmup_ratio": 0.5, "run.max_steps": 2})
    train(config)
    steps = _steps(Path(config.run.output_dir))
    # Step 1 averages its two passes: the first at the reference (KL 0), the second after one update.
    assert steps[0]["kl"] > 0 and steps[1]["kl"] > 0
    assert steps[0]["learning_rate"] < steps[1]["learning_rate"]  # warmup: 2 of the 4 optimizer steps


@pytest.mark.slow
def test_lora_with_adapter_disabled_reference(small_overrides, tiny_model_dir):
    pytest.importorskip("peft")
    config = load_config(overrides={**small_overrides, "model.name_or_path": str(tiny_model_dir),
                                    "model.lora.enabled": True, "model.lora.r": 4, "model.lora.dropout": 0.0,
                                    "model.lora.target_modules": ["q_proj", "v_proj"], "loss.beta": 0.1,
                                    "model.gradient_checkpointing": True, "run.max_steps": 2})
    train(config)
    checkpoint = ckpt.list_checkpoints(config.run.output_dir)[-1]
    assert (checkpoint / "model" / "adapter_config.json").is_file()
    assert not (checkpoint / "model" / "model.safetensors").exists()  # adapters only, no second full copy
    steps = _steps(Path(config.run.output_dir))
    assert steps[0]["kl"] == pytest.approx(0.0, abs=1e-6) and steps[1]["kl"] > 0
    # `grpo-engine eval` loads an adapter directory on top of its base model.
    from grpo_engine.tools.evaluate import run_eval

    metrics = run_eval(config, str(checkpoint / "model"), num_samples=2, greedy=False, batch_size=8)
    assert metrics["num_prompts"] == 9 and 0.0 <= metrics["pass@2"] <= 1.0


@pytest.mark.slow
def test_a_lora_checkpoint_names_its_base_by_absolute_path(small_overrides, tiny_model_dir, tmp_path, monkeypatch):
    """A run started with a relative --model records its base as an absolute path: `eval` of the checkpoint finds it
    from any working directory."""
    pytest.importorskip("peft")
    monkeypatch.chdir(tiny_model_dir.parent)
    config = load_config(overrides={**small_overrides, "model.name_or_path": tiny_model_dir.name,
                                    "model.lora.enabled": True, "model.lora.r": 2, "run.max_steps": 1})
    train(config)
    adapters = ckpt.list_checkpoints(config.run.output_dir)[-1] / "model"
    base = json.loads((adapters / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base == str(tiny_model_dir.resolve())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    from grpo_engine.tools.evaluate import run_eval

    metrics = run_eval(config, str(adapters), num_samples=1, greedy=True, batch_size=8)
    assert metrics["num_prompts"] == 9


@pytest.mark.slow
def test_reward_failure_stops_the_run_and_keeps_checkpoints(small_overrides, monkeypatch):
    monkeypatch.syspath_prepend(str(SUPPORT))
    import user_rewards

    user_rewards.calls["count"] = 0
    monkeypatch.setenv("CRASH_AT_CALL", "")
    config = load_config(overrides={**small_overrides, "run.save_steps": 1, "run.max_steps": 3,
                                    "rewards.functions": ["length", "user_rewards:wrong_length"]})
    with pytest.raises(RewardFunctionError, match="'wrong_length' must return a list of"):
        train(config)
    assert ckpt.list_checkpoints(config.run.output_dir) == []  # failed before its first step: nothing saved


def test_missing_model_and_data_errors(small_overrides, tmp_path):
    from grpo_engine.config import ConfigError

    with pytest.raises(ConfigError, match="model.name_or_path: expected a local model directory"):
        load_config(overrides={**small_overrides, "model.name_or_path": str(tmp_path / "none")})
    (tmp_path / "d.jsonl").write_text('{"question": "1+1"}\n')
    config = load_config(overrides={**small_overrides, "data.path": str(tmp_path / "d.jsonl")})
    from grpo_engine.data.prompts import DataError

    with pytest.raises(DataError, match="no 'prompt' column"):
        train(config)


@pytest.mark.slow
def test_full_model_reference_starts_at_zero_kl(small_overrides):
    config = load_config(overrides={**small_overrides, "loss.beta": 0.04, "run.max_steps": 2})
    train(config)
    steps = _steps(Path(config.run.output_dir))
    assert steps[0]["kl"] == pytest.approx(0.0, abs=1e-6) and steps[1]["kl"] > 0


@pytest.mark.slow
def test_tensorboard_sink(small_overrides):
    pytest.importorskip("tensorboard")
    config = load_config(overrides={**small_overrides, "run.report_to": ["tensorboard"], "run.max_steps": 1})
    train(config)
    events = list((Path(config.run.output_dir) / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
