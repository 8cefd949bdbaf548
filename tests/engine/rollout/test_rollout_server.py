"""The vllm_server backend against a stand-in server (tests/support/fake_vllm_server.py: the same HTTP endpoints,
sampling from a real model): training on- and off-policy, the weight push after every round, and the faults (a
server down at start, one that stops answering mid-run, a refused push, a server that may have lost its weights)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch

from grpo_engine.config import ConfigError, load_config
from grpo_engine.state.interrupt import RolloutServerLost
from grpo_engine.state.metrics import read_metrics
from tests.support.fake_vllm_server import FakeVLLMServer
from tests.support.server_models import save_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_model(tmp_path_factory.mktemp("served_model"))


@pytest.fixture()
def server(model_dir):
    fake = FakeVLLMServer(str(model_dir)).start()
    yield fake
    fake.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_overrides(small_overrides: dict, model_dir: Path, url: str, **extra) -> dict:
    return {**small_overrides, "model.name_or_path": str(model_dir), "rollout.backend": "vllm_server",
            "rollout.server.urls": [url], "rollout.server.timeout_s": 2.0, "data.max_prompt_length": 32,
            "rollout.temperature": 0.7, "optim.learning_rate": 0.05, **extra}


def train_rows(overrides: dict) -> list[dict]:
    from grpo_engine.trainer import train

    config = load_config(None, overrides)
    train(config)
    return [row for row in read_metrics(Path(config.run.output_dir)) if "loss" in row]


@pytest.mark.slow
def test_on_policy_run_pushes_every_round_and_samples_what_the_trainer_holds(small_overrides, model_dir, server):
    """max_staleness 0: the server gets the weights at the start and after each of the 3 rounds; a learning rate of
    0.05 moves the policy far, so its log-probs equal the trainer's (ratio 1 within 1e-4) only if every push
    landed."""
    rows = train_rows(server_overrides(small_overrides, model_dir, server.url))
    assert len(rows) == 3 and len(server.reloads) == 4
    for row in rows:
        assert abs(row["sampling/trainer_sampler_ratio/mean"] - 1.0) < 1e-4, row
        assert row["staleness/max"] == 0 and row["staleness/dropped_samples"] == 0
        assert "off_policy/ratio_mean" not in row  # auto: no correction on-policy


@pytest.mark.slow
def test_one_step_ahead_trains_on_samples_one_round_old_with_the_correction(small_overrides, model_dir, server):
    rows = train_rows(server_overrides(small_overrides, model_dir, server.url, **{"rollout.max_staleness": 1,
                                                                                 "run.max_steps": 4}))
    assert [row["staleness/max"] for row in rows] == [0, 1, 1, 1]
    assert all(row["staleness/dropped_samples"] == 0 for row in rows)
    # Step 1 samples the weights it trains; later ones a round older: the ratio leaves 1 and is corrected.
    assert abs(rows[0]["off_policy/ratio_mean"] - 1.0) < 1e-4
    assert max(abs(row["off_policy/ratio_mean"] - 1.0) for row in rows[1:]) > 1e-3
    for row in rows:
        assert row["off_policy/corrected_ratio_mean"] <= row["off_policy/ratio_mean"] + 1e-6
        assert row["off_policy/ratio_max"] > 3.0 or row["off_policy/capped_fraction"] == 0.0


def test_server_not_up_is_named_before_any_work(small_overrides, model_dir, tmp_path, capsys):
    from grpo_engine.cli import main

    url = f"http://127.0.0.1:{free_port()}"
    status = main(["train", "--model", str(model_dir), "--output-dir", str(tmp_path / "never"),
                   "--rollout.backend", "vllm_server", "--rollout.server.urls", f"[{url}]"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, err
    assert url in err[0] and "no vLLM server answers" in err[0]
    assert not (tmp_path / "never").exists()


def cli_flags(overrides: dict) -> list[str]:
    def text(value) -> str:
        if isinstance(value, list):
            return "[" + ", ".join(map(str, value)) + "]"
        return str(value).lower() if isinstance(value, bool) else str(value)

    return [part for key, value in overrides.items() for part in (f"--{key}", text(value))]


def test_server_that_stops_answering_stops_the_run_with_a_checkpoint(small_overrides, model_dir, server, capsys):
    """After 2 training steps' completions the server answers 503 to everything: retried for
    rollout.server.timeout_s (2 s), then the run saves the last completed round and says how to resume."""
    from grpo_engine.cli import main

    overrides = server_overrides(small_overrides, model_dir, server.url, **{"run.max_steps": 5})
    calls = {"n": 0}
    real_complete = server._complete

    def counting(body):
        calls["n"] += "seed" in body  # sampled: a training rollout (the evaluations are greedy)
        if calls["n"] == 8 * 2:
            server.die_after_completions = 0  # after this one
        return real_complete(body)

    server._complete = counting
    assert main(["train"] + cli_flags(overrides)) == 1
    err = capsys.readouterr().err
    assert f"the rollout server {server.url} did not answer for 2 s" in err, err
    checkpoints = sorted((Path(overrides["run.output_dir"]) / "checkpoints").iterdir())
    assert [c.name for c in checkpoints] == ["checkpoint-000002"], err  # step 2 trained, its push or step 3 failed
    assert "checkpoint saved to" in err and "Continue with: grpo-engine train --resume --output-dir" in err
    assert len([row for row in read_metrics(Path(overrides["run.output_dir"])) if "loss" in row]) in (1, 2)


def at_completion_request(server, number: int, fault) -> None:
    """Calls `fault()` when the server receives its `number`-th sampled completion request, then answers it."""
    calls = {"n": 0}
    real_complete = server._complete

    def complete(body):
        calls["n"] += "seed" in body
        if calls["n"] == number:
            fault()
        return real_complete(body)

    server._complete = complete


def record_trained_versions(monkeypatch) -> list:
    """The policy versions of the samples of every update, filled as the run trains."""
    from grpo_engine.steps import update as update_step

    seen_versions = []
    original = update_step.policy_update

    def recording(accelerator, policy, lm, optimizer, scheduler, inputs, *args, **kwargs):
        seen_versions.append(inputs.batch.policy_version.unique().tolist())
        return original(accelerator, policy, lm, optimizer, scheduler, inputs, *args, **kwargs)

    monkeypatch.setattr("grpo_engine.trainer.policy_update", recording)
    return seen_versions


@pytest.mark.slow
def test_refused_push_is_retried_and_an_unknown_version_never_reaches_the_loss(small_overrides, model_dir, server,
                                                                              monkeypatch):
    """A reload the server refuses twice is pushed again; completion requests answered 503 (a server that may have
    restarted with its starting weights) make their batch's version unknown: it is dropped, counted, the weights
    pushed again and the batch generated anew. The loss only ever sees version-matched samples (ratio 1)."""
    seen_versions = record_trained_versions(monkeypatch)
    server.fail_rpc = 2
    at_completion_request(server, 12, lambda: setattr(server, "fail_requests", 2))  # in step 2's batch
    rows = train_rows(server_overrides(small_overrides, model_dir, server.url))
    assert seen_versions == [[0], [1], [2]]
    assert rows[1]["staleness/dropped_samples"] == 8 and rows[-1]["staleness/dropped_samples"] == 8
    for row in rows:
        assert abs(row["sampling/trainer_sampler_ratio/mean"] - 1.0) < 1e-4, row


def test_config_rules():
    with pytest.raises(ConfigError, match="rollout.max_staleness .* needs rollout.backend vllm_server"):
        load_config(None, {"rollout.max_staleness": 1})
    with pytest.raises(ConfigError, match="does not return the kept-token sets"):
        load_config(None, {"rollout.backend": "vllm_server", "rollout.top_k": 5})
    with pytest.raises(ConfigError, match="rollout.server.urls"):
        load_config(None, {"rollout.backend": "vllm_server", "rollout.server.urls": ["localhost:8000"]})
    config = load_config(None, {"rollout.backend": "vllm_server", "rollout.max_staleness": 2})
    assert config.rollout.importance_sampling_mode() == "token_truncate"


def test_importance_weights_truncate_and_mask():
    from grpo_engine.steps.off_policy import importance_weights

    old = torch.log(torch.tensor([[0.5, 0.5, 0.9], [0.2, 0.9, 0.1]]))
    sampler = torch.log(torch.tensor([[0.5, 0.1, 0.3], [0.1, 0.9, 0.9]]))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    raw = (old - sampler).exp()
    weights, metrics = importance_weights(old, sampler, mask, "token_truncate", 3.0)
    torch.testing.assert_close(weights, torch.where(mask.bool(), raw.clamp(max=3.0), 1.0))
    assert metrics["off_policy/capped_fraction"] == pytest.approx(1 / 5)
    weights, _ = importance_weights(old, sampler, mask, "token_mask", 2.5)
    torch.testing.assert_close(weights, torch.where(mask.bool(), torch.where(raw > 2.5, 0.0, raw), 1.0))
    weights, _ = importance_weights(old, sampler, mask, "sequence_truncate", 100.0)
    sequence = torch.stack([raw[0].prod(), raw[1, :2].prod()])
    torch.testing.assert_close(weights[0], sequence[0].expand(3))
    torch.testing.assert_close(weights[1, :2], sequence[1].expand(2))


def lora_overrides(small_overrides: dict, model_dir: Path, url: str, **extra) -> dict:
    return server_overrides(small_overrides, model_dir, url, **{"model.lora.enabled": True, "model.lora.r": 4,
                                                                 "model.lora.dropout": 0.0,
                                                                 "optim.learning_rate": 0.2, **extra})


@pytest.mark.slow
def test_lora_run_pushes_adapters_and_samples_what_the_trainer_holds(small_overrides, model_dir, server):
    """LoRA over a server: the base weights are never pushed; each round's adapter is loaded under a new name that
    the completions then use (the ratio 1 within 1e-4 holds only if every adapter landed and was used), the old
    ones are unloaded, and only the newest adapter's directory is kept."""
    overrides = lora_overrides(small_overrides, model_dir, server.url)
    rows = train_rows(overrides)
    assert len(rows) == 3 and server.reloads == [] and len(server.adapter_loads) == 4
    assert len(set(server.adapter_loads)) == 4 and server.adapter_loads[-1].startswith("grpo-policy-v3-")
    assert list(server.adapters) == [server.adapter_loads[-1]]
    kept = sorted(p.name for p in (Path(overrides["run.output_dir"]) / "server_weights").iterdir())
    assert kept == [server.adapter_loads[-1]]
    for row in rows:
        assert abs(row["sampling/trainer_sampler_ratio/mean"] - 1.0) < 1e-4, row
    _, merged = server.adapters[server.adapter_loads[-1]]
    moved = max(float((a - b).abs().max()) for a, b in zip(merged.state_dict().values(),
                                                           server.model.state_dict().values()))
    assert moved > 1e-3  # the served adapter is not the base model


@pytest.mark.slow
def test_failed_adapter_loads_are_retried_and_a_lost_adapter_never_reaches_the_loss(small_overrides, model_dir,
                                                                                   server, monkeypatch):
    """Two adapter loads refused: pushed again under new names. A server that restarts mid-batch loses its adapter:
    the requests naming it (404) are answered by the base model, the batch's version is unknown, it is dropped,
    the adapter loaded again and the batch generated anew. The loss sees only version-matched samples."""
    seen_versions = record_trained_versions(monkeypatch)
    server.fail_lora_loads = 2
    at_completion_request(server, 12, server.adapters.clear)  # in step 2's batch: back with no adapter
    rows = train_rows(lora_overrides(small_overrides, model_dir, server.url))
    assert seen_versions == [[0], [1], [2]]
    assert rows[1]["staleness/dropped_samples"] == 8 and rows[-1]["staleness/dropped_samples"] == 8
    assert len(server.adapter_loads) == 5  # the start, three rounds, and the reload after the loss
    for row in rows:
        assert abs(row["sampling/trainer_sampler_ratio/mean"] - 1.0) < 1e-4, row


def test_adapter_push_that_keeps_failing_raises_and_leaves_the_version_unknown(small_overrides, model_dir, server,
                                                                              tmp_path, monkeypatch):
    from grpo_engine.model.loading import add_lora, load_causal_lm, load_tokenizer
    from grpo_engine.rollout import server as server_module
    from grpo_engine.rollout.server import VLLMServerRollout
    from grpo_engine.rollout.weight_push import WeightPushFailed

    monkeypatch.setattr(server_module, "PUSH_BACKOFF_S", 0.0)
    config = load_config(None, lora_overrides(small_overrides, model_dir, server.url))
    lm = add_lora(load_causal_lm(str(model_dir), config.model, torch.device("cpu")), config.model.lora)
    rollout = VLLMServerRollout(config, lm, load_tokenizer(str(model_dir)), torch.device("cpu"), str(tmp_path))
    rollout.sync_weights(0)
    served = rollout.model_name
    server.fail_lora_loads = server_module.PUSH_ATTEMPTS
    with pytest.raises(WeightPushFailed, match="HTTP 500"):
        rollout.sync_weights(1)
    assert rollout.version is None and rollout.model_name == served and list(server.adapters) == [served]
    assert rollout.generate(["1+1="] * 2).policy_version.tolist() == [-1, -1]
    rollout.sync_weights(1)
    assert rollout.version == 1 and list(server.adapters) == [rollout.model_name] != [served]
    rollout.close()


def test_a_server_without_runtime_lora_is_named_before_any_work(small_overrides, model_dir, server):
    from grpo_engine.rollout import check_backend

    server.runtime_lora = False
    config = load_config(None, lora_overrides(small_overrides, model_dir, server.url))
    with pytest.raises(ConfigError, match=f"rollout.server.lora_transfer: the vLLM server at {server.url} does "
                                          f"not load LoRA adapters .* grpo-engine serve --lora-rank 4"):
        check_backend(config, torch.device("cpu"))
    check_backend(load_config(None, lora_overrides(small_overrides, model_dir, server.url, **{
        "rollout.server.lora_transfer": "merged"})), torch.device("cpu"))
    server.runtime_lora = True
    check_backend(config, torch.device("cpu"))


def test_lora_transfer_rules():
    with pytest.raises(ConfigError, match="rollout.server.lora_transfer adapter needs model.lora.enabled"):
        load_config(None, {"rollout.backend": "vllm_server", "rollout.server.lora_transfer": "adapter"})
    with pytest.raises(ConfigError, match="rollout.server.weight_transfer reload sends whole weights"):
        load_config(None, {"rollout.backend": "vllm_server", "model.lora.enabled": True,
                           "rollout.server.weight_transfer": "reload"})
    lora = {"rollout.backend": "vllm_server", "model.lora.enabled": True}
    assert load_config(None, lora).pushes_lora_adapters()
    assert not load_config(None, {**lora, "rollout.server.lora_transfer": "merged",
                                  "rollout.server.weight_transfer": "reload"}).pushes_lora_adapters()
    assert not load_config(None, {**lora, "rollout.backend": "hf"}).pushes_lora_adapters()
