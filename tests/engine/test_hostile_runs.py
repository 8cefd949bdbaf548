"""What a user's data, model directory, reward function or disk can do to a run: each stops it with one line
naming the culprit and a non-zero exit (or is recovered, with a warning), and nothing already saved is lost."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest
import torch

from grpo_engine.state import checkpoint as ckpt
from grpo_engine.cli import main

SUPPORT = Path(__file__).parents[1] / "support"
SMALL = ["--run.warm_start_steps", "3", "--run.progress_bar", "false", "--run.plot", "false",
         "--data.builtin_max_operand", "2", "--data.builtin_eval_size", "2", "--rollout.num_generations", "4",
         "--rollout.max_new_tokens", "6", "--optim.per_device_train_batch_size", "8",
         "--run.log_completions_steps", "0", "--run.loss_backend", "torch"]


def _fails_in_one_line(capsys, args: list[str], expected: str) -> str:
    code = main(args)
    err = capsys.readouterr().err
    assert code == 1, err[-2000:]
    # transformers' loading bar (eval keeps it) is progress, not part of the failure
    lines = [line for line in err.splitlines() if line.strip() and not line.rstrip().endswith("it/s]")]
    assert "Traceback" not in err and len(lines) == 1, err[-2000:]
    assert lines[0].startswith(f"grpo-engine {args[0]}: ") and expected in lines[0], lines[0]
    return lines[0]


@pytest.fixture()
def hostile_rewards(monkeypatch):
    monkeypatch.syspath_prepend(str(SUPPORT))


# ---- reward functions ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,expected", [
    ("exits", "reward function 'exits' called sys.exit(0)"),
    ("hangs", "reward function 'hangs' did not return within 1 s (rewards.timeout_seconds"),
    ("hangs_and_swallows_exceptions", "'hangs_and_swallows_exceptions' did not return within 1 s"),
])
def test_a_reward_function_that_exits_or_hangs_stops_the_run_naming_it(name, expected, hostile_rewards, tmp_path,
                                                                     capsys):
    _fails_in_one_line(capsys, ["train", "--output-dir", str(tmp_path / "run"), *SMALL, "--run.max_steps", "2",
                                "--rewards.functions", f"[hostile_rewards:{name}]", "--rewards.timeout_seconds", "1"],
                       expected)


def test_the_reward_time_limit_must_be_positive(capsys):
    assert main(["train", "--rewards.timeout_seconds", "0"]) == 2
    assert "rewards.timeout_seconds: expected a value > 0.0, got 0" in capsys.readouterr().err


# ---- the run's files ----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_metrics_line_cut_mid_write_is_recovered_on_resume_and_plot(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["train", "--output-dir", str(run_dir), *SMALL, "--run.max_steps", "2", "--run.save_steps", "1"]) == 0
    metrics = run_dir / "metrics.jsonl"
    text = metrics.read_text()
    metrics.write_text(text[: len(text) - 40])  # what a kill during the last write leaves
    capsys.readouterr()
    assert main(["plot", str(run_dir), "--output", str(tmp_path / "c.png")]) == 0
    assert "the last line" in capsys.readouterr().err and (tmp_path / "c.png").stat().st_size > 0
    assert main(["train", "--output-dir", str(run_dir), *SMALL, "--run.max_steps", "3", "--run.save_steps", "1",
                 "--resume"]) == 0
    assert "was cut off mid-write; it is left out" in capsys.readouterr().err
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]  # every line whole again
    assert [row["step"] for row in rows if "reward" in row] == [1, 2, 3]


def _reward_steps(metrics: Path) -> list[int]:
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines() if '"reward"' in line]


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["cut_mid_line", "deleted"])
def test_a_checkpoint_implies_its_steps_logs(damage, tmp_path, capsys):
    """The run directory's history up to a checkpoint's step comes back from the checkpoint, whatever happened to
    metrics.jsonl since: the metrics steps of the resumed run are never [1, 2, 4, 5]."""
    run_dir = tmp_path / "run"
    assert main(["train", "--output-dir", str(run_dir), *SMALL, "--run.max_steps", "3", "--run.save_steps", "1"]) == 0
    metrics = run_dir / "metrics.jsonl"
    original = metrics.read_text()
    step_3 = next(line for line in original.splitlines() if line.startswith('{"step": 3, "reward"'))
    if damage == "cut_mid_line":  # a kill while step 3's line was written (and nothing after it)
        metrics.write_text(original[: original.index(step_3) + len(step_3) // 2])
    else:
        metrics.unlink()
    capsys.readouterr()
    assert main(["train", "--output-dir", str(run_dir), *SMALL, "--run.max_steps", "5", "--run.save_steps", "1",
                 "--resume"]) == 0
    assert _reward_steps(metrics) == [1, 2, 3, 4, 5]
    assert step_3 in metrics.read_text().splitlines()  # the very line step 3 logged
    kept = run_dir / "metrics.jsonl.replaced-at-step-000003"  # what the file held is kept, not lost
    assert (kept.read_text() == original[: original.index(step_3) + len(step_3) // 2]) if damage == "cut_mid_line" \
        else not kept.exists()


def test_an_unreadable_metrics_line_before_the_last_is_an_error_naming_it(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "rew\n{"step": 3}\n')
    _fails_in_one_line(capsys, ["plot", str(tmp_path)], "metrics.jsonl: line 2 is not a JSON object")


def test_a_full_disk_at_a_checkpoint_stops_the_run_in_one_line_keeping_the_earlier_one(monkeypatch, tmp_path,
                                                                                       capsys):
    run_dir = tmp_path / "run"
    save = ckpt.save_checkpoint

    def disk_fills_at_step_2(accelerator, run_dir, step, *args, **kwargs):
        if step == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(accelerator, run_dir, step, *args, **kwargs)

    monkeypatch.setattr(ckpt, "save_checkpoint", disk_fills_at_step_2)
    args = ["train", "--output-dir", str(run_dir), *SMALL, "--run.max_steps", "3", "--run.save_steps", "1"]
    _fails_in_one_line(capsys, args, "OSError: [Errno 28] No space left on device")
    assert [p.name for p in ckpt.list_checkpoints(run_dir)] == ["checkpoint-000001"]
    monkeypatch.setattr(ckpt, "save_checkpoint", save)
    assert main([*args, "--resume"]) == 0  # the directory was released, the checkpoint intact
    assert "at step 1 of 3" in capsys.readouterr().out


# ---- data and model directories -----------------------------------------------------------------------------------

def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.mark.parametrize("prompt,expected", [("", "row 1: the prompt ('prompt') is empty"),
                                             ("   ", "row 1: the prompt ('prompt') is empty"),
                                             ([], "row 1: the prompt ('prompt') is empty"),
                                             (7, "must be a string or a list of"),
                                             (None, "must be a string or a list of")])
def test_an_empty_or_non_text_prompt_is_one_line_before_the_model_loads(prompt, expected, tiny_model_dir, tmp_path,
                                                                        capsys):
    data = _jsonl(tmp_path / "data.jsonl", [{"prompt": "1+1=", "answer": "2"}, {"prompt": prompt, "answer": "3"}])
    _fails_in_one_line(capsys, ["eval", "--model", str(tiny_model_dir), "--data", data], expected)


def test_a_prompt_past_the_models_positions_is_one_line(tiny_model_dir, tmp_path, capsys):
    data = _jsonl(tmp_path / "data.jsonl", [{"prompt": "1+1=", "answer": "2"}, {"prompt": "1" * 200, "answer": "3"}])
    line = _fails_in_one_line(capsys, ["eval", "--model", str(tiny_model_dir), "--data", data,
                                       "--data.max_prompt_length", "null"], "row 1: a prompt of 200 tokens")
    assert "max_position_embeddings (128)" in line
    # truncated to fit, the same data evaluates
    assert main(["eval", "--model", str(tiny_model_dir), "--data", data, "--data.max_prompt_length", "100",
                 "--rollout.max_new_tokens", "4"]) == 0


def _copy(model_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(model_dir, tmp_path / "model"))


def test_a_checkpoint_whose_config_names_another_architecture_is_refused(tiny_model_dir, tmp_path, capsys):
    model = _copy(tiny_model_dir, tmp_path)
    config = json.loads((model / "config.json").read_text())
    config.update(architectures=["LlamaForCausalLM"], model_type="llama")  # Qwen2's weights less its biases
    (model / "config.json").write_text(json.dumps(config))
    line = _fails_in_one_line(capsys, ["eval", "--model", str(model)], "do not match the architecture")
    assert "6 weights in the checkpoint but not in the architecture: model.layers.0.self_attn.k_proj.bias" in line


def test_a_tokenizer_with_ids_past_the_models_vocabulary_is_refused(tiny_model_dir, tmp_path, capsys):
    from transformers import AutoTokenizer

    model = _copy(tiny_model_dir, tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.add_special_tokens({"pad_token": "<extra_pad>"})  # id 99, one past the 99 embedding rows
    tokenizer.save_pretrained(model)
    _fails_in_one_line(capsys, ["eval", "--model", str(model)],
                       "has 100 tokens but config.json's vocab_size has 99 rows")  # before the weights load


def test_lora_adapters_whose_base_model_is_gone_are_named(tiny_model_dir, tmp_path, capsys):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tiny_model_dir / name).is_file():
            shutil.copy(tiny_model_dir / name, adapter)
    gone = tmp_path / "deleted_base"
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(gone),
                                                             "peft_type": "LORA"}))
    _fails_in_one_line(capsys, ["eval", "--model", str(adapter)], f"base model {str(gone)!r}, which is not a local")


# ---- a vocabulary padded past the tokenizer (Qwen2.5) ---------------------------------------------------------------

@pytest.fixture(scope="module")
def padded_vocab_model():
    """The demo model with 128 vocabulary rows for its 99 tokens, the padding rows' logits the largest."""
    from grpo_engine.data.demo_task import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    lm = build_tiny_model(tokenizer, seed=0)
    lm.resize_token_embeddings(128)
    with torch.no_grad():
        head = lm.get_output_embeddings().weight
        head[99:] = 3.0 * head[:99].mean(0) + 0.5 * torch.randn(29, head.shape[1], generator=torch.Generator()
                                                                .manual_seed(0))
    return lm.eval(), tokenizer


@pytest.mark.parametrize("sample_padded", [False, True])
def test_padded_vocabulary_rows_are_sampled_only_when_asked(sample_padded, padded_vocab_model):
    from grpo_engine.config import RolloutConfig
    from grpo_engine.rollout import generate_completions

    lm, tokenizer = padded_vocab_model
    torch.manual_seed(0)
    config = RolloutConfig(num_generations=2, max_new_tokens=12, sample_padded_vocab=sample_padded)
    batch = generate_completions(lm, tokenizer, ["1+1="] * 16, config, None, torch.device("cpu"))
    drawn = batch.completion_ids[batch.completion_attention.bool()]
    assert bool((drawn >= len(tokenizer)).any()) == sample_padded
    if not sample_padded:
        greedy = generate_completions(lm, tokenizer, ["1+1="] * 2, config, None, torch.device("cpu"), greedy=True)
        assert int(greedy.completion_ids.max()) < len(tokenizer)


def test_the_trainer_scores_the_distribution_the_sampler_drew_from(padded_vocab_model):
    """Padding rows left out of sampling are left out of the log-probs too: the on-policy ratio is 1."""
    from grpo_engine.config import RolloutConfig
    from grpo_engine.steps.logprobs import sequence_logprobs
    from grpo_engine.model.limits import restrict_vocabulary, scored_vocab_size
    from grpo_engine.model.loading import HiddenStatePolicy
    from grpo_engine.rollout import generate_completions

    lm, tokenizer = padded_vocab_model
    torch.manual_seed(1)
    config = RolloutConfig(num_generations=2, max_new_tokens=8, temperature=0.7)
    batch = generate_completions(lm, tokenizer, ["2+2="] * 4, config, None, torch.device("cpu"))
    mask = batch.completion_attention.bool()
    restrict_vocabulary(lm, scored_vocab_size(tokenizer, lm, sample_padded_vocab=False))
    try:
        scored = sequence_logprobs(HiddenStatePolicy(lm), batch, 0.7, 4, "torch")
        torch.testing.assert_close(scored[mask], batch.sampler_logps[mask], rtol=0, atol=2e-5)
        restrict_vocabulary(lm, None)
        whole = sequence_logprobs(HiddenStatePolicy(lm), batch, 0.7, 4, "torch")
        assert float((whole[mask] - batch.sampler_logps[mask]).abs().max()) > 1e-2  # what scoring them would cost
    finally:
        restrict_vocabulary(lm, None)
