import pytest
import torch

from grpo_engine.config import LoraConfig, ModelConfig, RolloutConfig
from grpo_engine.model.loading import HiddenStatePolicy, add_lora, load_causal_lm, load_tokenizer
from grpo_engine.rollout.base import mask_after_eos
from grpo_engine.rollout.hf import generate_completions
from grpo_engine.steps.logprobs import completion_hidden_states, sequence_logprobs

CPU = torch.device("cpu")


def test_mask_after_eos():
    ids = torch.tensor([[5, 1, 7, 1], [5, 6, 7, 8], [1, 0, 0, 0]])
    mask, truncated = mask_after_eos(ids, [1])
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert truncated.tolist() == [False, True, False]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_causal_lm(str(tiny_model_dir), ModelConfig(), CPU), load_tokenizer(str(tiny_model_dir))


def test_generation_layout(tiny):
    lm, tokenizer = tiny
    torch.manual_seed(0)
    batch = generate_completions(lm, tokenizer, ["1+1=", "12+30="], RolloutConfig(max_new_tokens=6), None, CPU)
    assert batch.prompt_ids.shape[0] == 2 and batch.prompt_mask[0, 0] == 0  # left padding on the short prompt
    assert batch.completion_ids.shape[1] <= 6
    # Whatever follows the first EOS is padding and outside the mask.
    assert torch.all(batch.completion_ids[batch.completion_attention == 0] == tokenizer.pad_token_id)
    assert batch.completions[0] == tokenizer.decode(batch.completion_ids[0], skip_special_tokens=True)


def test_prompt_truncation_keeps_the_end(tiny):
    lm, tokenizer = tiny
    batch = generate_completions(lm, tokenizer, ["abcdefgh1+1="], RolloutConfig(max_new_tokens=2), 4, CPU, greedy=True)
    assert tokenizer.decode(batch.prompt_ids[0]) == "1+1="


def test_logprobs_match_the_sampler(tiny):
    """Our hidden-state path scores the sampled tokens as `generate` sampled them (left padding included)."""
    lm, tokenizer = tiny
    torch.manual_seed(1)
    prompts = ["1+1=", "12+30=", "7+7="]
    config = RolloutConfig(max_new_tokens=5, temperature=0.7)
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    torch.manual_seed(3)
    out = lm.generate(**encoded, do_sample=True, temperature=0.7, top_k=0, top_p=1.0, max_new_tokens=5,
                      output_scores=True, return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(3)
    batch = generate_completions(lm, tokenizer, prompts, config, None, CPU)
    scores = torch.stack(out.scores, dim=1).log_softmax(-1)  # processed by temperature
    expected = scores.gather(-1, out.sequences[:, encoded["input_ids"].shape[1]:, None])[..., 0]
    ours = sequence_logprobs(HiddenStatePolicy(lm), batch, 0.7, micro_batch_size=2, backend="torch")
    mask = batch.completion_attention.bool()
    torch.testing.assert_close(ours[mask], expected[:, : ours.shape[1]][mask], atol=1e-4, rtol=1e-4)


def test_no_logits_are_formed(tiny, monkeypatch):
    """The training-side forward never calls the LM head."""
    lm, tokenizer = tiny
    batch = generate_completions(lm, tokenizer, ["1+1="], RolloutConfig(max_new_tokens=3), None, CPU, greedy=True)

    def forbidden(*args, **kwargs):
        raise AssertionError("lm_head called")

    monkeypatch.setattr(lm.lm_head, "forward", forbidden)
    hidden = completion_hidden_states(HiddenStatePolicy(lm), batch)
    assert hidden.shape[:2] == batch.completion_ids.shape


def test_lora_adapters_disabled_give_the_base_logprobs(tiny_model_dir):
    pytest.importorskip("peft")
    lm = load_causal_lm(str(tiny_model_dir), ModelConfig(), CPU)
    tokenizer = load_tokenizer(str(tiny_model_dir))
    batch = generate_completions(lm, tokenizer, ["3+4="], RolloutConfig(max_new_tokens=4), None, CPU, greedy=True)
    base = sequence_logprobs(HiddenStatePolicy(lm), batch, 1.0, 4, "torch")
    peft_lm = add_lora(lm, LoraConfig(enabled=True, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # make the adapters matter
        for name, p in peft_lm.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    policy = HiddenStatePolicy(peft_lm)
    adapted = sequence_logprobs(policy, batch, 1.0, 4, "torch")
    disabled = sequence_logprobs(policy, batch, 1.0, 4, "torch", disable_adapters=True)
    mask = batch.completion_attention.bool()
    torch.testing.assert_close(disabled[mask], base[mask])
    assert not torch.allclose(adapted[mask], base[mask])


def test_truncated_completions_can_be_masked_out(tiny):
    lm, tokenizer = tiny
    torch.manual_seed(0)
    config = RolloutConfig(max_new_tokens=2, mask_truncated_completions=True)
    batch = generate_completions(lm, tokenizer, ["1+1="] * 8, config, None, CPU)
    assert batch.truncated.any()  # a random model rarely stops within 2 tokens
    assert torch.all(batch.completion_mask[batch.truncated] == 0)
    assert torch.equal(batch.completion_mask[~batch.truncated], batch.completion_attention[~batch.truncated])
