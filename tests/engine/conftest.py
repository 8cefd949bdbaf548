"""Shared fixtures: a saved tiny model directory (built in code) and small engine configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_engine.config import load_config
from grpo_engine.data.demo_task import build_char_tokenizer, build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """The built-in 2-layer Qwen2 and its character tokenizer, saved as a Hugging Face directory."""
    path = tmp_path_factory.mktemp("tiny_model")
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tensor_parallel_model_dir(tmp_path_factory) -> Path:
    """The built-in model and tokenizer with one more token (a tab): 100 vocabulary rows shard evenly over 2
    ranks. transformers 5.17 (the oldest supported) refuses to shard a gathered LM head unevenly, so the demo's
    99 rows cannot run tensor-parallel there; newer releases shard them 50/49."""
    path = tmp_path_factory.mktemp("tensor_parallel_model")
    tokenizer = build_char_tokenizer()
    tokenizer.add_tokens(["\t"])
    build_tiny_model(tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture()
def small_overrides(tmp_path) -> dict:
    """A few-second run: 2 prompts x 4 completions per step on the 9-problem addition task."""
    return {
        "run.output_dir": str(tmp_path / "run"), "run.max_steps": 3, "run.progress_bar": False, "run.plot": False,
        "run.log_completions_steps": 0, "run.loss_backend": "torch",
        "data.builtin_max_operand": 2,
        "rollout.num_generations": 4, "rollout.max_new_tokens": 8,
        "optim.per_device_train_batch_size": 8, "optim.learning_rate": 1e-2,
        # The length penalty varies between a random model's completions, so every step has a gradient.
        "rewards.functions": ["math_accuracy", "length"], "rewards.length_cache": 8,
    }


@pytest.fixture()
def small_config(small_overrides):
    return load_config(overrides=small_overrides)


@pytest.fixture(autouse=True)
def _engine_on_cpu(monkeypatch):
    """The engine tests are CPU tests (float32 models, gloo process groups, one process per rank, peak RSS): on a
    machine with CUDA they run on its CPU as on a CPU machine, in this process (run.device "auto" resolves to
    the CPU) and in the processes they start (which see no GPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture(autouse=True)
def _one_thread():
    # Two cores are shared by several test processes; one thread per process keeps timings predictable.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
