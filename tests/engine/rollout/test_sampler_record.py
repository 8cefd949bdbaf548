"""Replaying the sampler: recorded kept-token sets and sampler log-probs, and the trainer's log-probs over them
equal to the sampler's processed log-probs; the mismatch metric with and without replay."""

import math

import pytest
import torch

from grpo_engine.config import ModelConfig, RolloutConfig, load_config
from grpo_engine.model.loading import HiddenStatePolicy, load_causal_lm, load_tokenizer
from grpo_engine.rollout.hf import generate_completions
from grpo_engine.run_setup import sampling_warnings
from grpo_engine.rollout.hf import kept_ids
from grpo_engine.state.metrics import read_metrics
from grpo_engine.steps.logprobs import sequence_logprobs
from grpo_engine.trainer import train

CPU = torch.device("cpu")
PROMPTS = ["1+1=", "12+30=", "7+7=", "3+4="]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_causal_lm(str(tiny_model_dir), ModelConfig(), CPU), load_tokenizer(str(tiny_model_dir))


def test_kept_ids_lists_the_finite_scores():
    scores = torch.tensor([[0.5, float("-inf"), 2.0, float("-inf")], [float("-inf"), 1.0, float("-inf"), -3.0]])
    assert kept_ids(scores).tolist() == [[0, 2], [1, 3]]
    one = torch.tensor([[float("-inf"), 0.0, float("-inf")], [1.0, 2.0, 3.0]])
    assert kept_ids(one).tolist() == [[1, -1, -1], [0, 1, 2]]


@pytest.mark.parametrize("truncation", [dict(top_p=0.8), dict(top_k=5), dict(top_p=0.9, top_k=8)])
def test_trainer_logprobs_over_kept_sets_equal_the_samplers(tiny, truncation):
    lm, tokenizer = tiny
    config = RolloutConfig(max_new_tokens=6, temperature=0.9, **truncation)
    torch.manual_seed(0)
    batch = generate_completions(lm, tokenizer, PROMPTS, config, None, CPU, record_kept=True)
    valid = batch.completion_attention.bool()
    assert batch.kept_token_ids.shape[:2] == batch.completion_ids.shape
    assert bool((batch.kept_token_ids[~valid] == -1).all())
    if "top_k" in truncation:
        assert int((batch.kept_token_ids >= 0).sum(-1).max()) <= truncation["top_k"]
    policy = HiddenStatePolicy(lm)
    replayed = sequence_logprobs(policy, batch, 0.9, micro_batch_size=3, backend="gemm")
    torch.testing.assert_close(replayed[valid], batch.sampler_logps[valid], atol=2e-5, rtol=2e-5)
    # scored over the whole vocabulary the ratio is the kept mass: below 1 wherever something was cut
    whole = batch.select(slice(None))
    whole.kept_token_ids = None
    full = sequence_logprobs(policy, whole, 0.9, micro_batch_size=3, backend="gemm")
    cut = (batch.kept_token_ids >= 0).sum(-1) < len(tokenizer)
    assert bool((full[valid & cut] < batch.sampler_logps[valid & cut]).all())


def test_untruncated_sampling_records_no_sets_but_the_sampler_logps(tiny):
    lm, tokenizer = tiny
    torch.manual_seed(1)
    batch = generate_completions(lm, tokenizer, PROMPTS, RolloutConfig(max_new_tokens=5, temperature=0.7), None, CPU)
    assert batch.kept_token_ids is None
    ours = sequence_logprobs(HiddenStatePolicy(lm), batch, 0.7, micro_batch_size=4, backend="torch")
    valid = batch.completion_attention.bool()
    torch.testing.assert_close(ours[valid], batch.sampler_logps[valid], atol=2e-5, rtol=2e-5)


def _first_step_metrics(small_overrides, **overrides):
    config = load_config(overrides={**small_overrides, "run.max_steps": 1, "rollout.top_p": 0.7,
                                    "rollout.temperature": 1.0, **overrides})
    train(config)
    # the training rows (the accuracy before training is a row of its own, at step 0)
    return next(row for row in read_metrics(config.run.output_dir) if row["step"] == 1 and "reward" in row)


@pytest.mark.slow
def test_step_one_mismatch_metric_with_and_without_replay(small_overrides, tmp_path):
    replayed = _first_step_metrics(small_overrides)
    assert math.isclose(replayed["sampling/trainer_sampler_ratio/mean"], 1.0, abs_tol=1e-5)
    assert replayed["sampling/trainer_sampler_ratio/outside_0.9_1.1"] == 0.0
    plain = _first_step_metrics({**small_overrides, "run.output_dir": str(tmp_path / "plain")},
                                **{"rollout.replay_kept_tokens": False})
    assert plain["sampling/trainer_sampler_ratio/mean"] < 0.99


def test_off_policy_sampling_is_announced():
    penalty = load_config(overrides={"rollout.repetition_penalty": 1.3})
    assert any("off-policy" in note and "repetition_penalty=1.3" in note for note in sampling_warnings(penalty))
    no_replay = load_config(overrides={"rollout.top_k": 20, "rollout.replay_kept_tokens": False})
    assert any("kept mass" in note for note in sampling_warnings(no_replay))
    assert sampling_warnings(load_config(overrides={"rollout.top_p": 0.9})) == []
    assert load_config(overrides={"rollout.top_p": 0.9}).rollout.replays_kept_tokens()
    assert not load_config(overrides={}).rollout.replays_kept_tokens()
