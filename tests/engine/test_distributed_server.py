"""Past one machine, in small: two training processes under torchrun (gloo, CPU, FSDP2) generating through one
rollout server (the stand-in of tests/support/fake_vllm_server.py) one step ahead: each process sends its share of
the completions, process 0 pushes the gathered weights after every round."""

from __future__ import annotations

import json
import subprocess

import pytest

from processes import subprocess_env, torchrun
from repo_paths import ROOT

from tests.support.fake_vllm_server import FakeVLLMServer
from tests.support.server_models import save_model


@pytest.mark.slow
def test_two_fsdp_processes_train_through_one_server_one_step_ahead(tmp_path):
    model_dir = save_model(tmp_path / "model")
    server = FakeVLLMServer(str(model_dir)).start()
    try:
        run_dir = tmp_path / "run"
        flags = ["--model", str(model_dir), "--run.output_dir", str(run_dir), "--run.max_steps", "3",
                 "--run.progress_bar", "false", "--run.plot", "false", "--model.fsdp", "true",
                 "--data.builtin_max_operand", "2", "--data.max_prompt_length", "32", "--rollout.num_generations", "4",
                 "--rollout.max_new_tokens", "6", "--optim.per_device_train_batch_size", "4",
                 "--optim.learning_rate", "0.05", "--rewards.functions", "[math_accuracy, length]",
                 "--rewards.length_cache", "6", "--rollout.backend", "vllm_server",
                 "--rollout.server.urls", f"[{server.url}]", "--rollout.max_staleness", "1"]
        result = subprocess.run(torchrun("-m", "grpo_engine", "train", *flags), env=subprocess_env(), timeout=300,
                                capture_output=True, text=True, cwd=ROOT)
        assert result.returncode == 0, result.stderr[-3000:]
    finally:
        server.stop()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "loss" in row]
    assert [row["staleness/max"] for row in steps] == [0, 1, 1]
    assert abs(steps[0]["off_policy/ratio_mean"] - 1.0) < 1e-4  # step 1: the weights it trains, gathered and pushed
    assert len(server.reloads) == 4  # the start, then after each round: by process 0 alone
    assert server.completions >= 3 * 8  # both processes' shares of every step
