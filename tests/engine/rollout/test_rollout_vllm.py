"""The vllm rollout backend against the policy it samples for, on CPU with the CPU build of vLLM (`.ci/vllm_tests`
makes its environment; elsewhere these tests skip): greedy generations equal HF's after every weight sync, vLLM's
processed log-probs equal the trainer's log-probs of the sampled tokens (a stale sync would show), the mismatch
metric stays at 1 through a large-learning-rate training run, and vLLM's top-k / top-p sets equal the ones HF's
sampler keeps, which is what kept-set replay scores over."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from grpo_engine.config import load_config
from grpo_engine.steps.logprobs import sequence_logprobs
from grpo_engine.state.metrics import read_metrics
from grpo_engine.model.loading import HiddenStatePolicy, add_lora, load_causal_lm, load_tokenizer
from grpo_engine.rollout import HFRollout
from grpo_engine.rollout.hf import SamplerRecorder, kept_ids, sampling_processors
from tests.support.server_models import save_model

pytestmark = pytest.mark.vllm

CPU = torch.device("cpu")
PROMPTS = ["1+1=", "12+30=", "7+0=", "abc"]
TEMPERATURE = 0.7
VLLM_KEYS = {"rollout.backend": "vllm", "rollout.vllm.kv_cache_mb": 16, "data.max_prompt_length": 32,
             "rollout.temperature": TEMPERATURE}


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory) -> Path:
    return save_model(tmp_path_factory.mktemp("vllm_model"))


def push_towards(lm: torch.nn.Module, optimizer: torch.optim.Optimizer, input_ids: torch.Tensor, token: int) -> None:
    """One large optimizer step that raises `token`'s probability everywhere: the greedy outputs move."""
    logits = lm(input_ids=input_ids).logits.float()
    loss = -logits.log_softmax(-1)[..., token].mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_vllm_samples_from_the_policy_after_every_sync(vllm_model_dir, lora):
    from grpo_engine.rollout.vllm import VLLMRollout

    path = str(vllm_model_dir)
    config = load_config(None, {**VLLM_KEYS, "model.name_or_path": path, "rollout.max_new_tokens": 8,
                                "model.lora.enabled": lora, "model.lora.dropout": 0.0})
    lm = load_causal_lm(path, config.model, CPU)
    if lora:
        lm = add_lora(lm, config.model.lora)
    tokenizer = load_tokenizer(path)
    vllm_backend = VLLMRollout(config, lm, tokenizer, CPU, path)
    hf_backend = HFRollout(lm, tokenizer, config.rollout, config.data.max_prompt_length, CPU)
    policy = HiddenStatePolicy(lm)
    optimizer = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=0.05)
    greedy_outputs = []
    for step in range(3):
        greedy = vllm_backend.generate(PROMPTS, greedy=True)
        assert greedy.completion_ids.tolist() == hf_backend.generate(PROMPTS, greedy=True).completion_ids.tolist()
        greedy_outputs.append(greedy.completion_ids.tolist())

        torch.manual_seed(step)
        sampled = vllm_backend.generate(PROMPTS * 2)
        mask = sampled.completion_mask.bool()
        trainer = sequence_logprobs(policy, sampled, TEMPERATURE, 8, "torch")
        torch.testing.assert_close(trainer[mask], sampled.sampler_logps[mask], atol=3e-5, rtol=0)

        push_towards(lm, optimizer, sampled.input_ids, token=5 + step)
        stale = sequence_logprobs(policy, sampled, TEMPERATURE, 8, "torch")
        assert (stale[mask] - sampled.sampler_logps[mask]).abs().max() > 1e-2  # what a missed sync would leave
        vllm_backend.sync_weights()
    assert greedy_outputs[0] != greedy_outputs[-1]  # the steps changed what the policy says


def test_vllm_top_k_top_p_sets_equal_hf_sampler_sets(vllm_model_dir):
    """vLLM's processed distribution (all of it: logprobs=-1, the test-sized vocabulary allows it) is finite exactly
    on the ids HF's sampler keeps for the same prefix, with the same log-probs there."""
    from vllm import LLM, SamplingParams

    from grpo_engine.rollout.vllm import engine_args

    path = str(vllm_model_dir)
    config = load_config(None, {**VLLM_KEYS, "model.name_or_path": path})
    llm = LLM(**engine_args(config, path, CPU, 1, 0), max_logprobs=-1)
    lm = load_causal_lm(path, config.model, CPU).eval()
    tokenizer = load_tokenizer(path)
    requests = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    for top_k, top_p in [(5, 1.0), (0, 0.8), (7, 0.9)]:
        params = SamplingParams(temperature=TEMPERATURE, top_k=top_k if top_k else -1, top_p=top_p, logprobs=-1,
                                max_tokens=6, seed=1, detokenize=False)
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in requests], params, use_tqdm=False)
        for prompt_ids, output in zip(requests, outputs):
            completion = output.outputs[0]
            sequence = torch.tensor([prompt_ids + list(completion.token_ids)])
            with torch.no_grad():
                logits = lm(input_ids=sequence).logits[0, len(prompt_ids) - 1: -1].float()
            processors = sampling_processors(TEMPERATURE, top_k, top_p, SamplerRecorder(record_kept=True))
            scores = processors(sequence, logits)  # the warpers act row by row: every position at once
            hf_sets = kept_ids(scores)
            hf_logps = scores.log_softmax(-1)
            for t, position in enumerate(completion.logprobs):
                vllm_set = sorted(token for token, lp in position.items() if lp.logprob > -math.inf)
                assert vllm_set == sorted(i for i in hf_sets[t].tolist() if i >= 0), (top_k, top_p, t)
                vllm_logps = torch.tensor([position[token].logprob for token in vllm_set])
                torch.testing.assert_close(vllm_logps, hf_logps[t, vllm_set], atol=3e-5, rtol=0)
    del llm


def train_with_vllm(path: Path, overrides: dict) -> list[dict]:
    from grpo_engine.trainer import train

    config = load_config(None, {**overrides, **VLLM_KEYS, "model.name_or_path": str(path)})
    train(config)
    return [row for row in read_metrics(Path(config.run.output_dir)) if "sampling/trainer_sampler_ratio/mean" in row]


def test_training_keeps_the_sampler_ratio_at_one_and_a_stale_sync_would_show(small_overrides, monkeypatch,
                                                                              tmp_path):
    """A learning rate of 0.05 moves the tiny policy far at every step: vLLM's log-probs match the trainer's only
    if every step's weights reached it. Without the syncs after the first, the same run's ratio leaves 1. The
    model's vocabulary is padded (128 rows, 99 tokens): the trainer scores the first 99 rows, so the ratio is 1
    only if vLLM never samples the other 29 either."""
    from grpo_engine.rollout.vllm import VLLMRollout

    model_dir = save_model(tmp_path / "padded_model", vocab_rows=128)
    overrides = {**small_overrides, "optim.learning_rate": 0.05, "run.max_steps": 3}
    steps = train_with_vllm(model_dir, overrides)
    assert len(steps) == 3
    for row in steps:
        assert abs(row["sampling/trainer_sampler_ratio/mean"] - 1.0) < 1e-4, row
        assert row["sampling/trainer_sampler_ratio/outside_0.9_1.1"] == 0.0, row

    synced = VLLMRollout.sync_weights

    def only_the_first(self, version=0):  # the sync at start-up, then none
        if not getattr(self, "synced_once", False):
            self.synced_once = True
            synced(self, version)

    monkeypatch.setattr(VLLMRollout, "sync_weights", only_the_first)
    stale = train_with_vllm(model_dir, {**overrides, "run.output_dir": str(tmp_path / "stale")})
    assert abs(stale[0]["sampling/trainer_sampler_ratio/mean"] - 1.0) < 1e-4  # step 1 samples the starting weights
    assert max(abs(row["sampling/trainer_sampler_ratio/mean"] - 1.0) for row in stale[1:]) > 1e-3


@pytest.mark.parametrize("overrides, processes, message", [
    ({"rollout.top_k": 5}, 1, "rollout.replay_kept_tokens needs the kept sets of vLLM's sampler"),
    ({"rollout.top_p": 0.9}, 1, "rollout.replay_kept_tokens needs the kept sets of vLLM's sampler"),
    ({"rollout.vllm.sleep": True}, 1, "rollout.vllm.sleep needs CUDA"),
    ({}, 2, r"rollout.backend vllm runs in one process on a CPU \(this run has 2\)"),
])
def test_what_this_build_cannot_do_on_a_cpu_is_refused_before_loading(overrides, processes, message, vllm_model_dir):
    from grpo_engine.config import ConfigError
    from grpo_engine.rollout import check_backend

    keys = {**VLLM_KEYS, "model.name_or_path": str(vllm_model_dir), **overrides}
    with pytest.raises(ConfigError, match=message):
        check_backend(load_config(None, keys), CPU, processes)
    # Without replay the trainer scores the whole vocabulary: the same sampling settings are accepted.
    if "rollout.top_k" in overrides or "rollout.top_p" in overrides:
        check_backend(load_config(None, {**keys, "rollout.replay_kept_tokens": False}), CPU)


def test_a_head_size_without_a_cpu_kernel_is_refused_before_loading(tmp_path, capsys):
    """The built-in demo model's heads are 16 wide; vLLM's CPU attention has no kernel for them (32 works)."""
    from grpo_engine.cli import main
    from grpo_engine.rollout.vllm import cpu_attention_head_sizes

    assert 16 not in cpu_attention_head_sizes() and 32 in cpu_attention_head_sizes()
    run_dir = tmp_path / "run"
    assert main(["train", "--rollout.backend", "vllm", "--run.device", "cpu", "--output-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err  # vLLM's own log lines may come first
    line = err.strip().splitlines()[-1]
    assert "Traceback" not in err and line.startswith("grpo-engine: config error: rollout.backend vllm: ")
    assert "vLLM's CPU attention has no kernel for head size 16 (the built-in demo model" in line
    assert not run_dir.exists()  # refused before anything was written or loaded
