"""sdpa per packed sequence (grpo_engine.model.packed_attention) against transformers' sdpa: the same hidden states and
gradients on packs, the per-sequence calls taken only where the model's mask is causal within each sequence, and
every other input (padded batches, generation, a sliding window that cuts a sequence) left to sdpa as it was."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

import grpo_engine.model.packed_attention as packed_attention
from grpo_engine.model.loading import HiddenStatePolicy
from grpo_engine.model.packed_attention import PER_SEQUENCE_SDPA, use_per_sequence_attention


def qwen2(**overrides) -> Qwen2ForCausalLM:
    config = Qwen2Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         attn_implementation="sdpa", **overrides)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def packed_inputs(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 97, (1, sum(lengths)), generator=g)
    return ids, torch.cat([torch.arange(n) for n in lengths])[None]


def forward_and_grads(lm, attention: str, ids, mask, positions):
    lm.config._attn_implementation = attention
    lm.zero_grad(set_to_none=True)
    hidden = HiddenStatePolicy(lm).train()(ids, mask, positions)
    (hidden * torch.linspace(-1, 1, hidden.shape[-1])).sum().backward()
    return hidden.detach(), {n: p.grad.clone() for n, p in lm.named_parameters() if p.grad is not None}


class Calls:
    """Counts transformers' sdpa calls by whether they carried a mask."""

    def __init__(self, monkeypatch):
        self.masked, self.unmasked = 0, 0
        original = packed_attention.sdpa_attention_forward

        def counting(module, query, key, value, attention_mask, **kwargs):
            if attention_mask is None:
                self.unmasked += 1
            else:
                self.masked += 1
            return original(module, query, key, value, attention_mask, **kwargs)

        monkeypatch.setattr(packed_attention, "sdpa_attention_forward", counting)


@pytest.mark.parametrize("lengths", [[5, 9, 1, 14, 3], [12, 12, 12], [30, 2]])
def test_a_pack_gives_the_hidden_states_and_gradients_of_sdpa_one_call_per_sequence(lengths, monkeypatch):
    lm = qwen2()
    ids, positions = packed_inputs(lengths)
    dense, dense_grads = forward_and_grads(lm, "sdpa", ids, None, positions)
    calls = Calls(monkeypatch)
    per_sequence, grads = forward_and_grads(lm, PER_SEQUENCE_SDPA, ids, None, positions)
    assert (calls.unmasked, calls.masked) == (len(lengths) * lm.config.num_hidden_layers, 0)
    torch.testing.assert_close(per_sequence, dense, atol=1e-5, rtol=1e-5)
    assert grads.keys() == dense_grads.keys()
    for name, grad in dense_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-5 * grad.abs().max().item() + 1e-7, rtol=1e-4,
                                   msg=lambda m: f"d{name}: {m}")


def test_padded_batches_and_single_sequences_go_to_sdpa_with_their_mask(monkeypatch):
    lm = qwen2()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (3, 10), generator=g)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[0, :4] = 0  # left padding
    mask[2, :1] = 0
    dense, _ = forward_and_grads(lm, "sdpa", ids, mask, None)
    calls = Calls(monkeypatch)
    per_sequence, _ = forward_and_grads(lm, PER_SEQUENCE_SDPA, ids, mask, None)
    assert (calls.masked, calls.unmasked) == (lm.config.num_hidden_layers, 0)
    torch.testing.assert_close(per_sequence, dense, atol=1e-6, rtol=1e-6)
    one = ids[:1, 4:]  # one unpadded sequence: transformers' causal sdpa, no mask
    calls.masked = calls.unmasked = 0
    forward_and_grads(lm, PER_SEQUENCE_SDPA, one, None, torch.arange(one.shape[1])[None])
    assert (calls.masked, calls.unmasked) == (0, lm.config.num_hidden_layers)


def test_a_sliding_window_that_cuts_a_sequence_keeps_the_dense_mask(monkeypatch):
    lm = qwen2(use_sliding_window=True, sliding_window=4, max_window_layers=0)
    assert lm.model.layers[0].self_attn.sliding_window == 4
    ids, positions = packed_inputs([7, 3, 9])
    dense, _ = forward_and_grads(lm, "sdpa", ids, None, positions)
    calls = Calls(monkeypatch)
    per_sequence, _ = forward_and_grads(lm, PER_SEQUENCE_SDPA, ids, None, positions)
    assert (calls.masked, calls.unmasked) == (lm.config.num_hidden_layers, 0)
    torch.testing.assert_close(per_sequence, dense, atol=1e-6, rtol=1e-6)


def test_generation_is_unchanged():
    lm = qwen2().eval()
    prompts = torch.randint(1, 97, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(prompts)
    mask[1, :2] = 0
    kwargs = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    lm.config._attn_implementation = "sdpa"
    expected = lm.generate(prompts, **kwargs)
    assert use_per_sequence_attention(lm)
    assert torch.equal(lm.generate(prompts, **kwargs), expected)


def test_only_sdpa_is_switched_and_a_saved_model_loads_without_it(tmp_path):
    lm = qwen2()
    assert use_per_sequence_attention(lm) and lm.config._attn_implementation == PER_SEQUENCE_SDPA
    assert use_per_sequence_attention(lm)  # already
    lm.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert PER_SEQUENCE_SDPA not in json.dumps(saved)
    assert AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa").config._attn_implementation \
        == "sdpa"
    eager = qwen2()
    eager.config._attn_implementation = "eager"
    assert not use_per_sequence_attention(eager) and eager.config._attn_implementation == "eager"


def test_the_bounds_need_a_mask_causal_within_each_sequence_and_nothing_across(monkeypatch):
    from grpo_engine.model.packed_attention import per_sequence_bounds

    monkeypatch.setattr(packed_attention, "CHECK_ROWS", 4)  # several row blocks
    _, positions = packed_inputs([3, 5, 2])
    sequence = torch.tensor([0] * 3 + [1] * 5 + [2] * 2)
    causal = torch.tril(torch.ones(10, 10, dtype=torch.bool)) & (sequence[:, None] == sequence[None, :])
    assert per_sequence_bounds(causal[None, None], positions) == [0, 3, 8, 10]
    additive = torch.zeros(1, 1, 10, 10).masked_fill(~causal, float("-inf"))  # a float mask: 0 attends
    assert per_sequence_bounds(additive, positions) == [0, 3, 8, 10]
    across = causal.clone()
    across[9, 4] = True  # the last sequence sees the middle one
    assert per_sequence_bounds(across[None, None], positions) is None
    window = causal.clone()
    window[7, 3] = False  # a sliding window cuts the middle sequence
    assert per_sequence_bounds(window[None, None], positions) is None
    assert per_sequence_bounds(causal[None, None], positions + 1) is None  # not numbered from 0
    assert per_sequence_bounds(causal[None, None].expand(2, 1, 10, 10), positions) is None  # a batch of 2
