"""The vllm_server backend against a real vLLM server (the CPU build, started by the test with grpo-engine serve's
command on 127.0.0.1 and a free port; `.ci/vllm_tests` makes the environment, elsewhere these tests skip):
weights pushed through reload_weights after every optimizer step, greedy completions equal to the policy's own
after each push, the sampler's log-probs equal to the trainer's; a run at max_staleness 0 trains exactly as the
colocated vllm backend; a run one step ahead trains on samples one round old. The server takes LoRA adapters at
runtime (grpo-engine serve --lora-rank): a LoRA run pushes adapters and trains exactly as the colocated one."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grpo_engine.config import load_config
from grpo_engine.model.loading import HiddenStatePolicy, load_causal_lm, load_tokenizer
from grpo_engine.rollout import HFRollout
from grpo_engine.rollout.http_client import ServerClient
from grpo_engine.state.metrics import read_metrics
from grpo_engine.steps.logprobs import sequence_logprobs
from grpo_engine.tools.serve import serve_command
from tests.support.processes import free_port
from tests.support.server_models import save_model

pytestmark = pytest.mark.vllm

CPU = torch.device("cpu")
PROMPTS = ["1+1=", "12+30=", "7+0=", "abc"]
START_TIMEOUT_S = 300
LORA_RANK = 4
LORA_KEYS = {"model.lora.enabled": True, "model.lora.r": LORA_RANK, "model.lora.dropout": 0.0}


def started_server(tmp_path_factory, lora_rank):
    """(url, model dir) of a vLLM server started by grpo-engine serve's command, stopped when the module ends."""
    pytest.importorskip("vllm")
    model_dir = save_model(tmp_path_factory.mktemp("served"))
    port = free_port()
    args = argparse.Namespace(model=str(model_dir), host="127.0.0.1", port=port, dtype="float32", max_model_len=128,
                              python=sys.executable, lora_rank=lora_rank,
                              vllm_args=["--", "--kv-cache-memory-bytes", str(16 << 20), "--max-num-seqs", "64"])
    argv, env = serve_command(args, cuda=False)
    log = open(tmp_path_factory.mktemp("log") / "server.log", "w")
    process = subprocess.Popen(argv, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ServerClient(url, 0, 5).is_up():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            log.close()
            pytest.fail(f"the vLLM server did not come up: {Path(log.name).read_text()[-3000:]}")
        time.sleep(2)
    yield url, model_dir
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
    log.close()


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    yield from started_server(tmp_path_factory, None)


@pytest.fixture(scope="module")
def vllm_lora_server(tmp_path_factory):
    """A server of its own for LoRA adapters: its base weights are never reloaded (the CPU build serves requests
    naming an adapter from the base weights it packed before a reload_weights, seen here as stale completions)."""
    yield from started_server(tmp_path_factory, LORA_RANK)


def server_keys(url: str, model_dir: Path) -> dict:
    return {"model.name_or_path": str(model_dir), "rollout.backend": "vllm_server", "rollout.server.urls": [url],
            "data.max_prompt_length": 32, "rollout.temperature": 0.7, "rollout.server.timeout_s": 30.0}


def check_ratio_then_step(server, policy, lm, optimizer, step: int) -> None:
    """The server's sampled log-probs equal the trainer's (ratio 1 within 1e-4); then one large optimizer step that
    moves the greedy completions (towards token 5 + step)."""
    torch.manual_seed(step)
    sampled = server.generate(PROMPTS * 2)
    mask = sampled.completion_mask.bool()
    trainer = sequence_logprobs(policy, sampled, 0.7, 8, "torch")
    assert (trainer[mask] - sampled.sampler_logps[mask]).exp().sub(1).abs().max() < 1e-4  # the ratio
    logits = lm(input_ids=sampled.input_ids).logits.float()
    (-logits.log_softmax(-1)[..., 5 + step].mean()).backward()
    optimizer.step()
    optimizer.zero_grad()


def test_greedy_equals_the_policy_after_every_push(vllm_server, tmp_path):
    from grpo_engine.rollout.server import VLLMServerRollout

    url, model_dir = vllm_server
    config = load_config(None, {**server_keys(url, model_dir), "rollout.max_new_tokens": 8})
    lm = load_causal_lm(str(model_dir), config.model, CPU)
    tokenizer = load_tokenizer(str(model_dir))
    server = VLLMServerRollout(config, lm, tokenizer, CPU, str(tmp_path), None)
    hf = HFRollout(lm, tokenizer, config.rollout, config.data.max_prompt_length, CPU)
    policy = HiddenStatePolicy(lm)
    optimizer = torch.optim.AdamW(lm.parameters(), lr=0.05)
    server.sync_weights(0)
    outputs = []
    for step in range(3):
        greedy = server.generate(PROMPTS, greedy=True)
        assert greedy.completion_ids.tolist() == hf.generate(PROMPTS, greedy=True).completion_ids.tolist(), step
        assert greedy.policy_version.tolist() == [step] * len(PROMPTS)
        outputs.append(greedy.completion_ids.tolist())
        check_ratio_then_step(server, policy, lm, optimizer, step)
        server.sync_weights(step + 1)
    assert outputs[0] != outputs[-1]
    server.close()


def train_rows(overrides: dict) -> list[dict]:
    from grpo_engine.trainer import train

    config = load_config(None, overrides)
    train(config)
    return [row for row in read_metrics(Path(config.run.output_dir)) if "loss" in row]


def test_server_trains_exactly_as_colocated_and_one_step_ahead(vllm_server, small_overrides, tmp_path):
    url, model_dir = vllm_server
    common = {**small_overrides, **server_keys(url, model_dir), "optim.learning_rate": 0.05}
    server_rows = train_rows({**common, "run.output_dir": str(tmp_path / "server")})
    colocated = {key: value for key, value in common.items() if not key.startswith("rollout.server")}
    colocated_rows = train_rows({**colocated, "rollout.backend": "vllm", "rollout.vllm.kv_cache_mb": 16,
                                 "run.output_dir": str(tmp_path / "colocated")})
    for ours, theirs in zip(server_rows, colocated_rows, strict=True):
        assert ours["completions/mean_length"] == theirs["completions/mean_length"]  # the same samples
        for key in ("reward", "loss", "grad_norm"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key
        assert abs(ours["sampling/trainer_sampler_ratio/mean"] - 1.0) < 1e-4
    ahead = train_rows({**common, "rollout.max_staleness": 1, "run.max_steps": 3,
                        "run.output_dir": str(tmp_path / "ahead")})
    assert [row["staleness/max"] for row in ahead] == [0, 1, 1]
    assert abs(ahead[0]["off_policy/ratio_mean"] - 1.0) < 1e-4
    assert all(row["staleness/dropped_samples"] == 0 for row in ahead)


def test_serve_knows_vllms_lora_ranks():
    import typing

    from vllm.config.lora import MaxLoRARanks

    from grpo_engine.tools.serve import VLLM_LORA_RANKS

    assert VLLM_LORA_RANKS == typing.get_args(MaxLoRARanks)


def test_lora_adapter_pushes_serve_what_the_policy_holds(vllm_lora_server, tmp_path):
    """LoRA: each push loads the adapter under a new name (listed by /v1/models, the older one gone) and the
    greedy completions equal the peft policy's own after every push, while the base model's differ by the end."""
    from grpo_engine.model.loading import add_lora
    from grpo_engine.rollout.server import VLLMServerRollout

    url, model_dir = vllm_lora_server
    config = load_config(None, {**server_keys(url, model_dir), **LORA_KEYS, "rollout.max_new_tokens": 8})
    lm = add_lora(load_causal_lm(str(model_dir), config.model, CPU), config.model.lora)
    tokenizer = load_tokenizer(str(model_dir))
    server = VLLMServerRollout(config, lm, tokenizer, CPU, str(tmp_path), None)
    hf = HFRollout(lm, tokenizer, config.rollout, config.data.max_prompt_length, CPU)
    policy = HiddenStatePolicy(lm)
    optimizer = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=0.2)
    client = ServerClient(url, 0, 30)
    base = server.generate(PROMPTS, greedy=True).completion_ids.tolist()
    names = []
    for step in range(3):
        server.sync_weights(step)
        names.append(server.model_name)
        served = [m["id"] for m in client.get("/v1/models")["data"]]
        assert served == [server.base_model_name, server.model_name], served
        assert [p.name for p in (tmp_path / "server_weights").iterdir()] == [server.model_name]
        greedy = server.generate(PROMPTS, greedy=True)
        assert greedy.completion_ids.tolist() == hf.generate(PROMPTS, greedy=True).completion_ids.tolist(), step
        assert greedy.policy_version.tolist() == [step] * len(PROMPTS)
        check_ratio_then_step(server, policy, lm, optimizer, step)
    assert len(set(names)) == 3 and greedy.completion_ids.tolist() != base
    server.close()


def test_lora_server_trains_exactly_as_colocated(vllm_lora_server, small_overrides, tmp_path):
    url, model_dir = vllm_lora_server
    common = {**small_overrides, **server_keys(url, model_dir), **LORA_KEYS, "optim.learning_rate": 0.2}
    server_rows = train_rows({**common, "run.output_dir": str(tmp_path / "server")})
    colocated = {key: value for key, value in common.items() if not key.startswith("rollout.server")}
    colocated_rows = train_rows({**colocated, "rollout.backend": "vllm", "rollout.vllm.kv_cache_mb": 16,
                                 "run.output_dir": str(tmp_path / "colocated")})
    assert len({row["completions/mean_length"] for row in server_rows}) > 1 or \
        len({row["reward"] for row in server_rows}) > 1  # the adapter moves what is sampled
    for ours, theirs in zip(server_rows, colocated_rows, strict=True):
        assert ours["completions/mean_length"] == theirs["completions/mean_length"]  # the same samples
        for key in ("reward", "loss", "grad_norm"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key
        assert abs(ours["sampling/trainer_sampler_ratio/mean"] - 1.0) < 1e-4
    adapters = [m["id"] for m in ServerClient(url, 0, 30).get("/v1/models")["data"][1:]]
    assert len(adapters) == 1 and adapters[0].startswith("grpo-policy-v3-")
