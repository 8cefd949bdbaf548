"""A model whose logits are soft-capped (a Gemma-2-style config built in code): the engine trains it, and its
log-probs, through grpo_engine.model.loading.with_lm_head and the kernels, are the model's own (soft-capped) logits'."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM

from grpo_engine.config import ModelConfig, RolloutConfig, load_config
from grpo_engine.data.demo_task import build_char_tokenizer
from grpo_engine.model.loading import HiddenStatePolicy, load_causal_lm, load_tokenizer, position_ids_from_mask
from grpo_engine.rollout.hf import generate_completions
from grpo_engine.state import checkpoint as ckpt
from grpo_engine.steps.logprobs import sequence_logprobs
from grpo_engine.steps.update import UpdateInputs, micro_batch_loss
from grpo_engine.trainer import train
from grpo_kernels import GRPOLossConfig, LogitTransform
from grpo_kernels.integrations.lm_head import logit_transform

CPU = torch.device("cpu")
SOFTCAP = 2.0  # the raw logits (std ~2, initializer_range 0.3) run well into the tanh


@pytest.fixture(scope="module")
def softcapped_model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gemma2_style")
    tokenizer = build_char_tokenizer()
    config = Gemma2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=128, initializer_range=0.3,
        final_logit_softcapping=SOFTCAP, attn_logit_softcapping=None, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    Gemma2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _model_logprobs(lm, batch, temperature: float) -> torch.Tensor:
    """log_softmax of the model's own logits (soft-capped by its forward) over the completion tokens."""
    with torch.no_grad():
        logits = lm(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    position_ids=position_ids_from_mask(batch.attention_mask)).logits
    prompt_length = batch.prompt_ids.shape[1]
    log_probs = torch.log_softmax(logits[:, prompt_length - 1:-1].float() / temperature, dim=-1)
    return log_probs.gather(-1, batch.completion_ids[..., None])[..., 0]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "gemm"])
def test_trains_a_softcapped_model_and_scores_it_as_the_model_does(softcapped_model_dir, small_overrides, backend):
    config = load_config(overrides={**small_overrides, "model.name_or_path": str(softcapped_model_dir),
                                    "run.max_steps": 2, "loss.beta": 0.04, "run.loss_backend": backend,
                                    "model.attn_implementation": "eager"})  # Gemma 2 has no SDPA path
    summary = train(config)
    run_dir = Path(summary.run_dir)
    steps = [row for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "reward" in row]
    assert [row["step"] for row in steps] == [1, 2]
    assert all(math.isfinite(row["loss"]) and math.isfinite(row["entropy"]) for row in steps)
    assert any(row["grad_norm"] > 0 for row in steps)

    trained = ckpt.model_dir(ckpt.list_checkpoints(run_dir)[-1])
    lm, tokenizer = load_causal_lm(trained, ModelConfig(attn_implementation="eager"), CPU), load_tokenizer(trained)
    assert logit_transform(lm) == LogitTransform(softcap=SOFTCAP)
    torch.manual_seed(0)
    batch = generate_completions(lm, tokenizer, ["1+1=", "12+2=", "2+0=", "1+2="], RolloutConfig(max_new_tokens=6),
                                 None, CPU)
    mask = batch.completion_mask.bool()
    expected = _model_logprobs(lm, batch, temperature=0.7)
    # the old / reference log-prob route (linear_logprobs) ...
    ours = sequence_logprobs(HiddenStatePolicy(lm), batch, 0.7, micro_batch_size=2, backend=backend)
    torch.testing.assert_close(ours[mask], expected[mask], atol=2e-5, rtol=0)
    # ... and the loss route (fused_linear_grpo_loss), whose logps the update's metrics use
    inputs = UpdateInputs(batch=batch, advantages=torch.randn(4), old_logps=None, ref_logps=None,
                          num_items_in_batch=float(mask.sum()))
    out = micro_batch_loss(HiddenStatePolicy(lm), lm, inputs, slice(0, 4), GRPOLossConfig(temperature=0.7), backend)
    torch.testing.assert_close(out.logps[mask], expected[mask], atol=2e-5, rtol=0)
    # the soft-cap matters here: the uncapped logits would give other log-probs
    uncapped = sequence_logprobs(HiddenStatePolicy(_without_softcap(lm)), batch, 0.7, 2, backend)
    assert (uncapped[mask] - expected[mask]).abs().max() > 1e-2


def _without_softcap(lm):
    lm.config.final_logit_softcapping = None
    return lm
