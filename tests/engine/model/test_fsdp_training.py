"""`--model.fsdp true` under torchrun (2 gloo processes on CPU): parameters, gradients and AdamW state sharded by
FSDP2. The update on a fixed batch equals one process's (log-probs, loss, every gradient, weights and AdamW
state); the engine's run equals a DDP run on the same 2 processes (same samples, so same rewards) and resumes from
its sharded checkpoint exactly; its final `model/` loads without FSDP and evaluates. Bad combinations are refused."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from transformers import AutoModelForCausalLM

from grpo_engine.config import ConfigError, ModelConfig, load_config
from grpo_engine.model.fsdp import check_fsdp
from grpo_engine.model.loading import load_causal_lm
from grpo_engine.run_setup import setup_run
from grpo_engine.state import checkpoint as ckpt
from grpo_engine.tools.evaluate import run_eval
from processes import run_workers, subprocess_env, torchrun
from repo_paths import ROOT, SUPPORT

# Every process's micro-batch composition differs from one process's, and these are extremes over micro-batches
SPLIT_DEPENDENT = ("clip_ratio/low_min", "clip_ratio/high_max")


def _load(path: Path) -> dict:
    return torch.load(path, weights_only=False)


@pytest.mark.slow
def test_sharded_update_matches_one_process(tmp_path):
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    run_workers([sys.executable, str(SUPPORT / "fsdp_worker.py"), str(one)], timeout=180)
    run_workers(torchrun(str(SUPPORT / "fsdp_worker.py"), str(two)), timeout=180)
    single, sharded = _load(one), _load(two)
    assert (single["processes"], sharded["processes"]) == (1, 2)
    torch.testing.assert_close(sharded["old"], single["old"], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(sharded["ref"], single["ref"], atol=1e-6, rtol=1e-5)
    assert single["metrics"]["grad_norm"] > 0.05  # clipping (max_grad_norm 0.05) acted
    for name, value in single["metrics"].items():
        if name not in SPLIT_DEPENDENT:
            assert sharded["metrics"][name] == pytest.approx(value, rel=1e-5, abs=1e-8), name
    assert len(single["gradients"]) == len(sharded["gradients"]) == 2  # two optimizer steps
    for step, (whole, gathered) in enumerate(zip(single["gradients"], sharded["gradients"])):
        assert whole.keys() == gathered.keys()
        for name, grad in whole.items():
            torch.testing.assert_close(gathered[name], grad, rtol=1e-4, atol=1e-5 * grad.abs().max().item(),
                                       msg=lambda m: f"step {step} d{name}: {m}")
    assert set(sharded["weights"]) >= set(single["weights"])
    for name, weight in single["weights"].items():
        torch.testing.assert_close(sharded["weights"][name], weight, atol=1e-5, rtol=1e-4, msg=name)
    assert single["optimizer"].keys() == sharded["optimizer"].keys()
    for name, state in single["optimizer"].items():
        for key, value in state.items():
            torch.testing.assert_close(sharded["optimizer"][name][key], value, atol=1e-7, rtol=1e-4,
                                       msg=f"{name} {key}")


@pytest.mark.slow
def test_sharded_packed_update_equals_sharded_padded(tmp_path):
    """FSDP2 on 2 processes: packs of whole sequences (log-probs and update) against padded micro-batches."""
    padded, packed = tmp_path / "padded.pt", tmp_path / "packed.pt"
    for out, extra in ((padded, []), (packed, ["24"])):
        run_workers(torchrun(str(SUPPORT / "fsdp_worker.py"), str(out), *extra), timeout=180)
    a, b = _load(padded), _load(packed)
    assert a["processes"] == b["processes"] == 2
    torch.testing.assert_close(b["old"], a["old"], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(b["ref"], a["ref"], atol=1e-6, rtol=1e-5)
    for name, value in a["metrics"].items():
        assert b["metrics"][name] == pytest.approx(value, rel=1e-5, abs=1e-8), name
    for step, (x, y) in enumerate(zip(a["gradients"], b["gradients"])):
        # After an AdamW step (whose normalisation magnifies float32 rounding in tiny gradient entries) the
        # second step's gradients agree to 1e-4 of the largest.
        scale = 1e-5 if step == 0 else 1e-4
        for name, grad in x.items():
            torch.testing.assert_close(y[name], grad, rtol=1e-4, atol=scale * grad.abs().max().item(),
                                       msg=lambda m: f"step {step} d{name}: {m}")


TRAIN_FLAGS = ["--run.save_steps", "1", "--run.progress_bar", "false", "--run.plot", "false",
               "--run.warm_start_steps", "0", "--run.log_completions_steps", "0", "--data.builtin_max_operand", "2",
               "--rollout.num_generations", "4", "--rollout.max_new_tokens", "8",
               "--optim.per_device_train_batch_size", "4", "--optim.gradient_accumulation_steps", "2",
               "--loss.beta", "0.04", "--rewards.functions", "[math_accuracy, length]", "--rewards.length_cache", "8"]
TIMINGS = ("step_time", "tokens/s", "memory/peak_mb")


def _train(run_dir: Path, *extra: str) -> list[dict]:
    result = subprocess.run([*torchrun("-m", "grpo_engine", "train", "--run.output_dir", str(run_dir),
                                        "--run.max_steps", "3", *TRAIN_FLAGS, *extra)],
                            env=subprocess_env(), timeout=300, capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _untimed(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in TIMINGS and not k.startswith("time/")}


def _optimizer_by_name(checkpoint: Path, tmp_path: Path) -> dict:
    """The AdamW state of a sharded checkpoint, whole, by parameter name (read without processes)."""
    whole = tmp_path / f"{checkpoint.parent.parent.name}-{checkpoint.name}.pt"
    dcp_to_torch_save(checkpoint / ckpt.SHARDED_DIR, whole)
    return _load(whole)["optimizer"]["state"]


@pytest.mark.slow
def test_sharded_run_matches_ddp_resumes_exactly_and_exports_a_plain_model(tmp_path):
    ddp_dir, fsdp_dir, resumed_dir = tmp_path / "ddp", tmp_path / "fsdp", tmp_path / "resumed"
    ddp = _train(ddp_dir)
    sharded = _train(fsdp_dir, "--model.fsdp", "true")
    steps = [row for row in sharded if "reward" in row]
    assert [row["step"] for row in steps] == [1, 2, 3] and any(row["grad_norm"] > 0 for row in steps)
    # Every process generates from the same seed under both: same samples, same rewards; the loss within float
    for one, two in zip([row for row in ddp if "reward" in row], steps, strict=True):
        for name in ("reward", "reward_std", "num_tokens", "completions/mean_length", "frac_reward_zero_std"):
            assert two[name] == one[name], (one["step"], name)
        for name in ("loss", "grad_norm", "entropy", "kl", "clip_ratio/region_mean"):
            assert two[name] == pytest.approx(one[name], rel=1e-5, abs=1e-8), (one["step"], name)

    final = fsdp_dir / "checkpoints" / "checkpoint-000003"
    assert not (final / "optimizer.pt").exists()
    manifest = json.loads((final / ckpt.MANIFEST_FILE).read_text())
    assert {"sharded/.metadata", "sharded/__0_0.distcp", "sharded/__1_0.distcp"} <= set(manifest)
    # The sharded AdamW state, whole, is DDP's (whose optimizer.pt is ordered as the model's parameters)
    ddp_optimizer = _load(ddp_dir / "checkpoints" / "checkpoint-000003" / "optimizer.pt")["state"]
    names = [name for name, _ in AutoModelForCausalLM.from_pretrained(final / "model").named_parameters()]
    sharded_optimizer = _optimizer_by_name(final, tmp_path)
    assert sorted(sharded_optimizer) == sorted(names)
    for index, name in enumerate(names):
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(sharded_optimizer[name][key], ddp_optimizer[index][key], atol=1e-8, rtol=1e-4)

    # Resume from the step-2 checkpoint of a copy: the same steps, weights and AdamW state, exactly
    shutil.copytree(fsdp_dir, resumed_dir)
    shutil.rmtree(resumed_dir / "checkpoints" / "checkpoint-000003")
    resumed = _train(resumed_dir, "--model.fsdp", "true", "--run.resume", "latest")
    assert [_untimed(row) for row in resumed] == [_untimed(row) for row in sharded]
    resumed_final = resumed_dir / "checkpoints" / "checkpoint-000003"
    weights = load_file(final / "model" / "model.safetensors")
    assert load_file(resumed_final / "model" / "model.safetensors").keys() == weights.keys()
    for name, weight in load_file(resumed_final / "model" / "model.safetensors").items():
        assert torch.equal(weight, weights[name]), name
    for name, state in _optimizer_by_name(resumed_final, tmp_path).items():
        for key, value in state.items():
            assert torch.equal(value, sharded_optimizer[name][key]), (name, key)

    # model/ is whole: plain transformers loads it (the tied head included), equal to DDP's, and it evaluates
    plain = AutoModelForCausalLM.from_pretrained(final / "model")
    assert plain.lm_head.weight is plain.model.embed_tokens.weight
    for name, weight in load_file(ddp_dir / "checkpoints" / "checkpoint-000003" / "model" / "model.safetensors").items():
        torch.testing.assert_close(plain.state_dict()[name], weight, atol=1e-6, rtol=1e-5, msg=name)
    config = load_config(overrides={"rollout.max_new_tokens": 8, "data.builtin_max_operand": 2})
    metrics = run_eval(config, str(final / "model"), num_samples=1, greedy=True, batch_size=16)
    assert metrics["num_prompts"] == 9 and 0.0 <= metrics["accuracy"] <= 1.0

    # A damaged shard is found by the checksums, and `latest` falls back past it
    shard = final / "sharded" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-10])
    point = ckpt.resolve_resume("latest", fsdp_dir)
    assert point.path.name == "checkpoint-000002"
    assert "sharded/__1_0.distcp is truncated" in point.skipped[0]


@pytest.mark.slow
def test_a_sharded_bfloat16_run_steps_float32_copies_and_resumes_them_exactly(tmp_path):
    """optim.master_weights auto with model.dtype bfloat16 under FSDP: each process's float32 copies are its shards
    of the weights, saved with the sharded AdamW state and restored in float32 on resume."""
    run_dir, resumed_dir = tmp_path / "run", tmp_path / "resumed"
    flags = ("--model.fsdp", "true", "--model.dtype", "bfloat16")
    sharded = _train(run_dir, *flags)
    final = run_dir / "checkpoints" / "checkpoint-000003"
    optimizer = _optimizer_by_name(final, tmp_path)
    weights = load_file(final / "model" / "model.safetensors")
    for name, state in optimizer.items():
        assert state["master"].dtype == torch.float32 and state["exp_avg"].dtype == torch.float32, name
        if name in weights:  # the saved weight is its copy rounded
            assert torch.equal(weights[name], state["master"].to(torch.bfloat16)), name
    shutil.copytree(run_dir, resumed_dir)
    shutil.rmtree(resumed_dir / "checkpoints" / "checkpoint-000003")
    resumed = _train(resumed_dir, *flags, "--run.resume", "latest")
    assert [_untimed(row) for row in resumed] == [_untimed(row) for row in sharded]
    for name, state in _optimizer_by_name(resumed_dir / "checkpoints" / "checkpoint-000003", tmp_path).items():
        for key, value in state.items():
            assert torch.equal(value, optimizer[name][key]), (name, key)


def test_training_refuses_fsdp_on_one_process(tmp_path):
    config = load_config(overrides={"model.fsdp": True, "run.output_dir": str(tmp_path / "run")})
    with pytest.raises(ConfigError, match=r"model.fsdp needs 2 or more processes .*torchrun --nproc_per_node N"):
        setup_run(config)
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_refuses_fsdp_with_lora_or_tensor_parallelism():
    with pytest.raises(ConfigError, match="model.fsdp does not support model.lora.enabled"):
        load_config(overrides={"model.fsdp": True, "model.lora.enabled": True})
    with pytest.raises(ConfigError, match="model.fsdp cannot be combined with model.tensor_parallel > 1"):
        load_config(overrides={"model.fsdp": True, "model.tensor_parallel": 2})
    check_fsdp(load_config(overrides={"model.fsdp": True}), 2)
    check_fsdp(load_config(), 1)  # off: nothing to check


def test_resume_of_a_sharded_run_needs_the_sharded_state(tmp_path):
    from saved_states import trained_states, write_sharded_state, write_states

    write_states(tmp_path, {key: value for key, value in trained_states().items() if key != "optimizer"})
    with pytest.raises(ckpt.CheckpointError, match="has no sharded/ weights and optimizer state: it was saved "
                                                   "without model.fsdp"):
        ckpt.load_training_state(tmp_path, 0, sharded_optimizer=True)
    write_sharded_state(tmp_path / ckpt.SHARDED_DIR)
    assert "optimizer" not in ckpt.load_training_state(tmp_path, 0, sharded_optimizer=True)


def test_a_model_kept_on_the_cpu_for_sharding_has_the_training_devices_dtype(tiny_model_dir):
    """FSDP loads the model on the CPU and moves only the shards: its dtype is still the one `model.dtype: auto`
    gives the training device (bf16 for CUDA), not the CPU's fp32. No GPU is touched."""
    lm = load_causal_lm(str(tiny_model_dir), ModelConfig(), torch.device("cuda"), keep_on_cpu=True)
    assert {p.dtype for p in lm.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in lm.parameters()} == {"cpu"}
