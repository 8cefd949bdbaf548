"""rollout.backend without vLLM: the choice, its keys and a missing install, each said in one line before any work.
(The vllm backend itself is tested where vLLM is installed: test_rollout_vllm.py.)"""

from __future__ import annotations

import importlib.util

import pytest

from grpo_engine.cli import main
from grpo_engine.config import ConfigError, load_config


@pytest.mark.parametrize("overrides, message", [
    ({"rollout.backend": "sglang"}, "rollout.backend: expected one of hf, vllm, vllm_server, got 'sglang'"),
    ({"rollout.vllm.gpu_memory_utilization": 1.5},
     "rollout.vllm.gpu_memory_utilization: expected a value <= 1.0, got 1.5"),
    ({"rollout.vllm.tensor_parallel_size": 2}, "rollout.vllm.tensor_parallel_size must be 1 or model.tensor_parallel"),
    ({"rollout.vllm.kv_cache_mb": 0}, "rollout.vllm.kv_cache_mb: expected a value >= 1, got 0"),
])
def test_backend_keys_are_checked(overrides, message):
    with pytest.raises(ConfigError) as refused:
        load_config(None, {"rollout.backend": "vllm", **overrides})
    assert message in str(refused.value)


def test_the_vllm_backend_without_vllm_says_how_to_install_it(monkeypatch, tmp_path, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    run_dir = tmp_path / "run"
    assert main(["train", "--rollout.backend", "vllm", "--output-dir", str(run_dir)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "rollout.backend vllm needs vLLM" in lines[0] and "pip install vllm" in lines[0]
    assert not run_dir.exists()
