"""The padding-free step (grpo_engine.steps.packing) against the padded one on the same rollouts: the packs, the
packed forward's hidden states, and the update's loss, metrics and every gradient (each optimizer step) for every
loss type, with the old and reference log-probs packed alike, kept-token sets and LoRA."""

from __future__ import annotations

from typing import Optional

import pytest
import torch
from accelerate import Accelerator

from grpo_engine.config import ConfigError, load_config
from grpo_engine.data.demo_task import build_char_tokenizer, build_tiny_model
from grpo_engine.steps.logprobs import reference_logprobs, sequence_logprobs
from grpo_engine.model.loading import HiddenStatePolicy, add_lora, frozen_copy
from grpo_engine.config import LoraConfig
from grpo_engine.rollout import RolloutBatch
from grpo_engine.model.packed_attention import PER_SEQUENCE_SDPA
from grpo_engine.steps.packing import (Pack, Packing, PackedAttentionError, attention_pair_cost, build_pack,
                                  check_packed_attention, has_varlen_attention, make_packs, pack_hidden_states,
                                  plan_micro_batches, plan_packs, split_to_count)
from grpo_engine.steps.update import UpdateInputs, num_items_per_process, policy_update
from grpo_kernels import GRPOLossConfig
from grpo_testing import loss_config

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "vespo", "luspo")
N, T, MICRO = 12, 16, 4


def rollouts(vocab: int, n: int = N, seed: int = 0, kept: int = 0, truncated_masked: bool = False,
             spread: Optional[tuple[int, int]] = None) -> RolloutBatch:
    """Left-padded prompts of 2-6 tokens, right-padded completions of long-tailed lengths (most short, a few
    up to T) or evenly over `spread` (low, high), sampler log-probs, and optionally kept-token sets of `kept` ids
    holding the sampled one."""
    g = torch.Generator().manual_seed(seed)
    P = 6
    prompt_lengths = torch.randint(2, P + 1, (n,), generator=g)
    prompt_mask = (torch.arange(P)[None, :] >= P - prompt_lengths[:, None]).long()
    prompt_ids = torch.where(prompt_mask.bool(), torch.randint(3, vocab, (n, P), generator=g), 0)
    lengths = (torch.distributions.Exponential(0.25).sample((n,)).ceil().long().clamp(1, T))
    lengths[0] = T  # one completion reaches the end
    if spread is not None:
        lengths = torch.linspace(*spread, n).round().long()[torch.randperm(n, generator=g)]
    attention = (torch.arange(T)[None, :] < lengths[:, None]).long()
    completion_ids = torch.where(attention.bool(), torch.randint(3, vocab, (n, T), generator=g), 0)
    loss_mask = attention.clone()
    if truncated_masked:
        loss_mask[1] = 0  # mask_truncated_completions: in the forward, out of the loss
    sampler = -torch.rand(n, T, generator=g) * attention
    kept_ids = None
    if kept:
        others = torch.randint(3, vocab, (n, T, kept), generator=g)
        others[..., 0] = completion_ids
        kept_ids = torch.where(attention[..., None].bool(), others, -1)
        kept_ids[..., -1] = torch.where(attention.bool(), -1, kept_ids[..., -1])  # sets of unequal sizes
    return RolloutBatch(["p"] * n, ["c"] * n, prompt_ids, prompt_mask, completion_ids, attention, loss_mask,
                        lengths >= T, sampler, kept_ids)


def _model(lora: bool = False, attention: str = "sdpa"):
    lm = build_tiny_model(build_char_tokenizer(), seed=0)
    lm.config._attn_implementation = attention
    if lora:
        lm = add_lora(lm, LoraConfig(enabled=True, r=4, alpha=8, dropout=0.0))
    return lm


def update_once(config: GRPOLossConfig, packing: Optional[Packing], batch_kwargs: Optional[dict] = None,
                lora: bool = False, backend: str = "torch", attention: str = "sdpa") -> dict:
    """Two SGD steps (num_iterations 2) of the update on fixed rollouts: old log-probs, reference log-probs when
    beta != 0, metrics and the gradient of every trainable parameter at each optimizer step."""
    torch.manual_seed(0)
    lm = _model(lora, attention)
    policy = HiddenStatePolicy(lm).train()
    reference = None if lora or config.beta == 0 else HiddenStatePolicy(frozen_copy(lm))
    batch = rollouts(lm.config.vocab_size, **(batch_kwargs or {}))
    old = sequence_logprobs(policy, batch, config.temperature, MICRO, backend, packing=packing)
    ref = None if config.beta == 0 else reference_logprobs(policy, reference, batch, config.temperature, MICRO,
                                                           backend, packing=packing)
    trainable = [(name, p) for name, p in policy.named_parameters() if p.requires_grad]
    optimizer = torch.optim.SGD([p for _, p in trainable], lr=0.5)
    gradients = []
    optimizer.register_step_pre_hook(lambda *_: gradients.append({n: p.grad.clone() for n, p in trainable}))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    accelerator = Accelerator(cpu=True)
    advantages = torch.linspace(-1.5, 1.5, batch.completion_ids.shape[0])
    inputs = UpdateInputs(batch, advantages, old, ref, num_items_per_process(accelerator, batch.completion_mask))
    metrics = policy_update(accelerator, policy, lm, optimizer, scheduler, inputs, config, MICRO, num_iterations=2,
                            max_grad_norm=0.0, backend=backend, step=1, packing=packing)
    return {"old": old, "ref": ref, "metrics": metrics, "gradients": gradients}


def assert_same_update(packed: dict, padded: dict) -> None:
    torch.testing.assert_close(packed["old"], padded["old"], atol=1e-5, rtol=1e-5)
    if padded["ref"] is not None:
        torch.testing.assert_close(packed["ref"], padded["ref"], atol=1e-5, rtol=1e-5)
    assert packed["metrics"].keys() == padded["metrics"].keys()
    for name, value in padded["metrics"].items():
        assert packed["metrics"][name] == pytest.approx(value, rel=1e-4, abs=1e-6, nan_ok=True), name
    assert len(packed["gradients"]) == len(padded["gradients"]) == 2
    for step, (a, b) in enumerate(zip(packed["gradients"], padded["gradients"])):
        assert any(g.abs().max() > 0 for g in b.values())
        for name, grad in b.items():
            torch.testing.assert_close(a[name], grad, rtol=1e-4, atol=1e-5 * grad.abs().max().item() + 1e-9,
                                       msg=lambda m: f"step {step} d{name}: {m}")


# 40 tokens: packs of 2 to 5 sequences, none of them the padded step's groups of 4
BUDGET = Packing(max_tokens=40)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_packed_update_equals_padded_for_every_loss_type(loss_type):
    config = loss_config(loss_type=loss_type, beta=0.04, max_completion_length=T, epsilon=0.1)
    assert_same_update(update_once(config, BUDGET), update_once(config, None))


def test_packed_update_equals_padded_with_kept_token_sets_and_masked_truncations():
    config = GRPOLossConfig(beta=0.04)
    kwargs = dict(kept=4, truncated_masked=True, seed=3)
    assert_same_update(update_once(config, BUDGET, kwargs), update_once(config, None, kwargs))


def test_packed_update_equals_padded_with_lora_on_the_gemm_backend():
    config = GRPOLossConfig(loss_type="grpo", beta=0.04)  # the reference: the LoRA policy with adapters off
    packed = update_once(config, Packing(), lora=True, backend="gemm")  # the default budget
    assert_same_update(packed, update_once(config, None, lora=True, backend="gemm"))
    assert all("lora_" in name for name in packed["gradients"][0])


@pytest.mark.parametrize("spread", [(T, T), (12, T), (1, T), None])  # uniform, narrow, wide, long-tailed
@pytest.mark.parametrize("attention", ["sdpa", PER_SEQUENCE_SDPA])
def test_the_default_route_trains_as_the_padded_step_at_every_spread(spread, attention):
    """The default (each batch packed or padded by estimated cost, the model's own pair cost) on batches of
    several completion-length spreads: the route it takes gives the padded step's log-probs, metrics and
    gradients."""
    lm = _model(attention=attention)
    default = Packing(None, has_varlen_attention(lm), attention_pair_cost(lm.config))
    config = GRPOLossConfig(loss_type="dapo", beta=0.04)
    kwargs = dict(spread=spread)
    assert_same_update(update_once(config, default, kwargs, attention=attention),
                       update_once(config, None, kwargs))


def test_the_default_route_is_the_cheaper_measured_one_on_the_benchmarks_batches():
    """grpo_engine.tools.packing_bench's batches (benchmarks/results/engine-packing-cpu.md): under sdpa's dense mask
    the uniform 128-token completions (92% fill) ran slower packed than padded, the long tails (34%, 26%) faster;
    per sequence, packs ran faster at every spread. The estimate picks those routes."""
    from transformers import Qwen2Config

    from grpo_engine.tools import packing_bench as bench

    config = Qwen2Config(hidden_size=bench.HIDDEN, intermediate_size=bench.INTERMEDIATE,
                         num_attention_heads=bench.HEADS, num_key_value_heads=bench.KV_HEADS)
    expected_dense = {"uniform-128": "padded", "96-128": "padded", "long-tail": "packed", "long-tail-short": "packed"}
    for spread, dense_route in expected_dense.items():
        batch = bench.rollouts(spread, seed=0)
        for varlen, route in ((False, dense_route), (True, "packed")):
            parts = plan_micro_batches(batch, Packing(None, varlen, attention_pair_cost(config)), bench.MICRO)
            assert ("packed" if isinstance(parts[0], Pack) else "padded") == route, (spread, varlen)


def test_equal_unpadded_sequences_stay_padded():
    batch = rollouts(50, spread=(T, T))
    batch.prompt_mask[:] = 1  # every prompt 6 tokens: no padding anywhere, nothing for packs to save
    parts = plan_micro_batches(batch, Packing(None, True, attention_pair_cost(_model().config)), MICRO)
    assert parts == [slice(s, s + MICRO) for s in range(0, N, MICRO)]
    assert all(isinstance(p, Pack) for p in plan_micro_batches(batch, Packing(max_tokens=64), MICRO))  # explicit


def test_packs_hold_whole_sequences_within_the_budget():
    lengths = [9, 3, 17, 1, 5, 5, 12, 2]
    packs = plan_packs(lengths, 20)
    assert sorted(i for pack in packs for i in pack) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in pack) <= 20 for pack in packs)
    assert len(packs) == 3  # 54 tokens: first fit, longest first, fills three packs of 20
    split = split_to_count(packs, lengths, 6)
    assert len(split) == 6 and sorted(i for pack in split for i in pack) == list(range(len(lengths)))


def test_a_pack_is_the_sequences_real_tokens_with_restarting_positions():
    batch = rollouts(50)
    pack = build_pack(batch, [2, 5])
    expected, positions = [], []
    for row in (2, 5):
        tokens = torch.cat([batch.prompt_ids[row][batch.prompt_mask[row].bool()],
                            batch.completion_ids[row][batch.completion_attention[row].bool()]])
        expected.append(tokens)
        positions.append(torch.arange(len(tokens)))
    assert torch.equal(pack.input_ids[0], torch.cat(expected))
    assert torch.equal(pack.position_ids[0], torch.cat(positions))
    assert torch.equal(pack.input_ids[0, pack.hidden_index + 1], pack.completion_ids)  # each predicts the next
    assert pack.cu_seqlens.tolist() == [0, *torch.cumsum(batch.completion_attention[[2, 5]].sum(1), 0).tolist()]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_hidden_states_equal_the_padded_forwards(attn):
    lm = _model()
    lm.config._attn_implementation = attn
    policy = HiddenStatePolicy(lm).eval()
    batch = rollouts(lm.config.vocab_size)
    pack = build_pack(batch, list(range(N)))
    with torch.no_grad():
        packed = pack_hidden_states(policy, pack)
        padded = policy(batch.input_ids, batch.attention_mask)[:, batch.prompt_ids.shape[1] - 1: -1]
    torch.testing.assert_close(packed, padded[pack.grid_index], atol=1e-5, rtol=1e-5)


def test_a_model_whose_attention_crosses_packed_sequences_is_refused(monkeypatch):
    import transformers.masking_utils as masking_utils

    policy = HiddenStatePolicy(_model())
    check_packed_attention(policy, policy.lm.config.vocab_size, torch.device("cpu"))  # transformers' own: accepted
    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", lambda position_ids: None)
    with pytest.raises(PackedAttentionError, match="optim.padding_free"):
        check_packed_attention(policy, policy.lm.config.vocab_size, torch.device("cpu"))


def test_a_sequence_longer_than_the_budget_is_refused_naming_the_key():
    batch = rollouts(50)
    with pytest.raises(ValueError, match=r"optim.max_tokens_per_micro_batch \(8\) is smaller than one sequence"):
        make_packs(batch, Packing(max_tokens=8), MICRO)
    with pytest.raises(ConfigError, match="optim.max_tokens_per_micro_batch .* must hold the longest sequence"):
        load_config(overrides={"optim.max_tokens_per_micro_batch": 100, "data.max_prompt_length": 64,
                               "rollout.max_new_tokens": 64})
    assert load_config(overrides={"optim.max_tokens_per_micro_batch": 100, "optim.padding_free": False,
                                  "data.max_prompt_length": 64, "rollout.max_new_tokens": 64})
    assert load_config().optim.padding_free  # the default


def test_the_default_budget_under_a_dense_mask_is_twice_the_longest_sequence_or_1024_tokens_under_varlen_a_padded_micro_batch():
    from grpo_engine.steps.packing import DENSE_MASK_MIN_TOKENS, token_budget

    batch = rollouts(50)
    longest = int((batch.prompt_mask.sum(1) + batch.completion_attention.sum(1)).max())
    dense, varlen = make_packs(batch, Packing(), MICRO), make_packs(batch, Packing(varlen_attention=True), MICRO)
    assert max(pack.num_tokens for pack in dense) <= min(MICRO * longest, max(2 * longest, DENSE_MASK_MIN_TOKENS))
    assert max(pack.num_tokens for pack in varlen) <= MICRO * longest
    assert len(varlen) < N // MICRO  # the long tail leaves room: fewer micro-batches than the padded step
    # Long sequences: twice the longest under a dense mask; short ones: at least 1024 tokens, never more than a
    # padded micro-batch; varlen: always a padded micro-batch.
    assert token_budget([40, 900, 300], Packing(), 8) == 1800
    assert token_budget([20, 25, 12], Packing(), 128) == DENSE_MASK_MIN_TOKENS
    assert token_budget([20, 25, 12], Packing(), 4) == 100
    assert token_budget([20, 25, 12], Packing(varlen_attention=True), 128) == 128 * 25
    lm = _model()
    assert not has_varlen_attention(lm)  # sdpa
    lm.config._attn_implementation = "flash_attention_2"
    assert has_varlen_attention(lm)
    lm.config._attn_implementation = PER_SEQUENCE_SDPA
    assert has_varlen_attention(lm)


def test_loss_scale_for_equal_micro_batches_is_trls_division_by_the_accumulation_steps():
    from grpo_engine.steps.update import loss_scale

    def scale(loss_type: str) -> float:
        return loss_scale(loss_type, 4, 30.0, 16, 100.0)

    for loss_type in ("grpo", "dr_grpo", "sapo", "luspo"):
        assert scale(loss_type) == 1 / 4
    for loss_type in ("dapo", "cispo", "vespo"):
        assert scale(loss_type) == 1.0
    assert scale("bnpo") == 0.3  # the batch's tokens, not the micro-batch's
