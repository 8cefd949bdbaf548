"""patch_causal_lm: per-token log-probs from the fused head equal the model's own logits, family by family (the
soft-capped and scaled heads of Gemma 2, Cohere and Granite included), and the logit transform is read from the
config as TRL 1.16 reads it.

Tolerance (float32): log-probs and entropies within 2e-5 absolute of log_softmax(model(...).logits);
parameter gradients within 1e-4 * max|grad| + 1e-7 of the logits path's.
"""

from __future__ import annotations

import pytest
import torch
from integration_models import FAMILIES, TRANSFORMED_FAMILIES, VOCAB_SIZE, tiny_causal_lm

from grpo_kernels import LogitTransform
from grpo_kernels.integrations.lm_head import logit_transform
from grpo_kernels.integrations.transformers import head_logit_transform, is_patched, patch_causal_lm, unpatch_causal_lm

LOGP_ATOL = 2e-5
GRAD_RTOL = 1e-4


def _batch(seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB_SIZE, (3, 10), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0  # left padding
    attention_mask[2, -3:] = 0  # right padding
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :4] = -100  # the "prompt": no log-probs wanted there
    return input_ids, attention_mask, labels


def _logits_path(model, input_ids, attention_mask, labels, temperature=1.0):
    logits = model(input_ids, attention_mask=attention_mask).logits.float() / temperature
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
    targets = labels[:, 1:]
    mask = targets != -100
    logps = log_probs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
    entropy = -(log_probs.exp() * log_probs).sum(-1) * mask
    return logps, entropy, mask


def _grads(model):
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def _assert_grads_close(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name, grad in expected.items():
        scale = grad.abs().max().item()
        error = (actual[name] - grad).abs().max().item()
        assert error <= GRAD_RTOL * scale + 1e-7, f"{name}: max error {error:.3g} vs max |grad| {scale:.3g}"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logprobs_entropy_and_grads_match_the_model_logits(family):
    model = tiny_causal_lm(family)
    input_ids, attention_mask, labels = _batch()
    # A loss that weights every token differently, so the gradient check sees each position.
    weights = torch.linspace(-1.0, 2.0, labels.shape[1] - 1)

    expected_logps, expected_entropy, mask = _logits_path(model, input_ids, attention_mask, labels)
    (expected_logps * weights + 0.3 * expected_entropy).sum().backward()
    expected_grads = _grads(model)
    model.zero_grad()

    patch_causal_lm(model, backend="torch")
    out = model(input_ids, attention_mask=attention_mask, labels=labels, return_logprobs=True, return_entropy=True)
    assert out.logps.dtype == torch.float32 and out.logps.shape == (3, 9)
    assert torch.equal(out.label_mask, mask)
    torch.testing.assert_close(out.logps, expected_logps, atol=LOGP_ATOL, rtol=0)
    torch.testing.assert_close(out.entropy, expected_entropy, atol=LOGP_ATOL, rtol=0)
    assert bool((out.logps[~mask] == 0).all()) and bool((out.logps[mask] < 0).all())
    (out.logps * weights + 0.3 * out.entropy).sum().backward()
    _assert_grads_close(_grads(model), expected_grads)


@pytest.mark.parametrize("family", ["qwen2", *TRANSFORMED_FAMILIES])
def test_temperature_scales_the_logits(family):
    # the temperature divides the transformed logits (after a soft-cap), as TRL and generation apply it
    model = patch_causal_lm(tiny_causal_lm(family), backend="torch")
    input_ids, attention_mask, labels = _batch(seed=2)
    with torch.no_grad():
        expected, _, _ = _logits_path(model, input_ids, attention_mask, labels, temperature=0.7)
        out = model(input_ids, attention_mask=attention_mask, labels=labels, return_logprobs=True, temperature=0.7)
    torch.testing.assert_close(out.logps, expected, atol=LOGP_ATOL, rtol=0)
    assert out.entropy is None


def test_plain_forward_and_generate_are_untouched_and_unpatch_restores():
    model = tiny_causal_lm("llama")
    input_ids, attention_mask, _ = _batch(seed=3)
    with torch.no_grad():
        before = model(input_ids, attention_mask=attention_mask).logits
        patch_causal_lm(model)
        assert is_patched(model)
        after = model(input_ids, attention_mask=attention_mask).logits
        generated = model.generate(input_ids[1:2], max_new_tokens=3, do_sample=False, pad_token_id=0)
    torch.testing.assert_close(after, before, atol=0, rtol=0)
    assert generated.shape == (1, 13)
    unpatch_causal_lm(model)
    assert not is_patched(model) and "forward" not in vars(model)


def test_lm_head_fn_gets_the_whole_head_and_the_hidden_states():
    model = patch_causal_lm(tiny_causal_lm("mistral"))
    input_ids, attention_mask, _ = _batch(seed=4)
    seen = {}

    def head_fn(hidden, weight, bias):
        seen.update(hidden=hidden.shape, weight=weight.shape, bias=bias)
        return hidden.sum()

    out = model(input_ids, attention_mask=attention_mask, lm_head_fn=head_fn)
    assert seen == {"hidden": (3, 10, 32), "weight": (VOCAB_SIZE, 32), "bias": None}
    torch.testing.assert_close(out.head_output, out.last_hidden_state.sum())


def test_peft_lora_model_routes_through_the_patched_forward():
    peft = pytest.importorskip("peft")
    model = tiny_causal_lm("qwen2")
    input_ids, attention_mask, labels = _batch(seed=5)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                      init_lora_weights=False))
    expected, _, _ = _logits_path(lora, input_ids, attention_mask, labels)
    patch_causal_lm(lora.get_base_model(), backend="torch")
    out = lora(input_ids=input_ids, attention_mask=attention_mask, labels=labels, return_logprobs=True)
    torch.testing.assert_close(out.logps, expected, atol=LOGP_ATOL, rtol=0)
    out.logps.sum().backward()
    lora_grads = [p.grad for name, p in lora.named_parameters() if "lora_" in name]
    assert lora_grads and all(g is not None and g.abs().sum() > 0 for g in lora_grads)


def test_transformed_heads_are_patched_with_their_transform():
    expected = {"gemma2": LogitTransform(softcap=3.0), "cohere": LogitTransform(scale=1.8),
                "granite": LogitTransform(scale=2.0), "llama": LogitTransform()}
    for family, transform in expected.items():
        assert head_logit_transform(patch_causal_lm(tiny_causal_lm(family))) == transform, family


# (config attributes set, model_type or None): every attribute name TRL 1.16 reads, alone and together
CONFIG_CASES = [
    (dict(final_logit_softcapping=30.0), None),
    (dict(logit_scale=0.0625), None),
    (dict(logit_scale=0.0), None),  # TRL keeps a real 0: every logit 0
    (dict(output_multiplier=0.2, final_logit_softcapping=20.0), None),  # Muse Glimmer: scale, then cap
    (dict(lm_head_multiplier=0.3), None),
    (dict(logits_scaling=8.0), None),  # Granite: divides
    (dict(logits_scaling=8.0), "hyperclovax"),  # HyperCLOVA X: multiplies
    (dict(logit_scale=2.0, output_multiplier=3.0, lm_head_multiplier=5.0, logits_scaling=7.0), None),  # first wins
    (dict(logit_scale=None, lm_head_multiplier=5.0, logits_scaling=7.0), None),
    (dict(logit_scale=None, final_logit_softcapping=None), None),
]


def _trl_transform(model) -> LogitTransform:
    """The (softcap, scale) TRL 1.16's fused head hands its kernel for `model`."""
    import trl.trainer.utils as trl_utils

    seen = {}

    class Captured(Exception):
        pass

    def capture(hidden, weight, bias, targets, temperature, chunk_size, softcap, scale, outputs):
        seen.update(softcap=softcap, scale=scale)
        raise Captured

    trl_utils.add_fused_lm_head(model)
    ids = torch.randint(3, VOCAB_SIZE, (1, 4))
    original = trl_utils._ChunkedLogProbFunction.apply
    trl_utils._ChunkedLogProbFunction.apply = capture
    try:
        with pytest.raises(Captured):
            model(ids, labels=ids, fused_lm_head=True)
    finally:
        trl_utils._ChunkedLogProbFunction.apply = original
    return LogitTransform(scale=seen["scale"], softcap=seen["softcap"])


@pytest.mark.parametrize("attributes,model_type", CONFIG_CASES, ids=lambda x: str(x))
def test_logit_transform_reads_the_config_as_trl_does(attributes, model_type):
    pytest.importorskip("trl")
    model = tiny_causal_lm("llama")
    for name, value in attributes.items():
        setattr(model.config, name, value)
    if model_type is not None:
        model.config.model_type = model_type
    assert logit_transform(model) == _trl_transform(model)


@pytest.mark.parametrize("name,value,message", [
    ("final_logit_softcapping", -1.0, "a soft-cap must be > 0"),
    ("final_logit_softcapping", 0.0, "a soft-cap must be > 0"),
    ("logit_scale", "inv_sqrt_d_model", "expected a finite number"),  # MPT's string form
    ("lm_head_multiplier", float("inf"), "expected a finite number"),
    ("logits_scaling", 0.0, "divided by zero"),
])
def test_refuses_logit_transforms_it_cannot_express(name, value, message):
    model = tiny_causal_lm("llama")
    setattr(model.config, name, value)
    with pytest.raises(ValueError, match=f"LlamaForCausalLM sets config.{name}=.*{message}"):
        patch_causal_lm(model)


def test_refuses_heads_it_cannot_reproduce():
    peft = pytest.importorskip("peft")
    lora_head = peft.get_peft_model(tiny_causal_lm("llama"),
                                    peft.LoraConfig(r=2, target_modules=["q_proj", "lm_head"]))
    with pytest.raises(NotImplementedError, match="lm_head carries a PEFT adapter"):
        patch_causal_lm(lora_head.get_base_model())


def test_bad_calls_name_the_argument():
    model = patch_causal_lm(tiny_causal_lm("llama"))
    input_ids, attention_mask, labels = _batch()
    with pytest.raises(ValueError, match="needs labels"):
        model(input_ids, attention_mask=attention_mask, return_logprobs=True)
    with pytest.raises(ValueError, match="^temperature only applies with return_logprobs"):
        model(input_ids, attention_mask=attention_mask, temperature=0.5)
    with pytest.raises(ValueError, match="labels must be a tensor of shape"):
        model(input_ids, attention_mask=attention_mask, labels=labels[:, 1:], return_logprobs=True)
    with pytest.raises(ValueError, match="backend"):
        patch_causal_lm(model, backend="cuda")
