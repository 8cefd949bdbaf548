"""Tiny randomly initialised transformers models and an in-code tokenizer: no hub access anywhere."""

from __future__ import annotations

import string

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (CohereConfig, CohereForCausalLM, Gemma2Config, Gemma2ForCausalLM, GemmaConfig,
                          GemmaForCausalLM, GraniteConfig, GraniteForCausalLM, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>"]
CHARACTERS = list(string.ascii_lowercase + string.digits + " +=?.")
VOCAB = {token: index for index, token in enumerate(SPECIAL_TOKENS + CHARACTERS)}
VOCAB_SIZE = len(VOCAB)

# Small enough that a forward+backward takes milliseconds, large enough for grouped-query attention.
_SIZES = dict(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              pad_token_id=0, eos_token_id=1, bos_token_id=1)

FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"head_dim": 8}),
    "mistral": (MistralConfig, MistralForCausalLM, {"sliding_window": None}),
    "gemma": (GemmaConfig, GemmaForCausalLM, {"head_dim": 8}),
    # Heads whose logits are transformed. A wider initialisation gives logits of std ~2 (max ~7), so the
    # transforms matter: Gemma 2's tanh soft-cap at 3 saturates, Cohere multiplies, Granite divides.
    "gemma2": (Gemma2Config, Gemma2ForCausalLM, {"head_dim": 8, "initializer_range": 0.3,
                                                 "final_logit_softcapping": 3.0}),
    "cohere": (CohereConfig, CohereForCausalLM, {"initializer_range": 0.3, "logit_scale": 1.8}),
    "granite": (GraniteConfig, GraniteForCausalLM, {"initializer_range": 0.3, "logits_scaling": 0.5}),
}
TRANSFORMED_FAMILIES = ("gemma2", "cohere", "granite")


def tiny_causal_lm(family: str, seed: int = 0, **overrides) -> torch.nn.Module:
    config_class, model_class, extra = FAMILIES[family]
    torch.manual_seed(seed)
    config = config_class(**{**_SIZES, **extra, **overrides})
    return model_class(config).eval()


def character_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, built from a vocabulary in code."""
    tokenizer = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", padding_side="left")


def tiny_grpo_trainer(trainer_class, model, output_dir, peft_config=None, **config_overrides):
    """A real TRL GRPOTrainer on CPU around a tiny model, with a one-reward toy task."""
    from datasets import Dataset
    from trl import GRPOConfig

    def reward_short_digits(completions, **kwargs):
        # Any deterministic reward with spread across a group works; this one prefers digits.
        return [float(sum(ch.isdigit() for ch in text)) - 0.1 * len(text) for text in completions]

    settings = dict(output_dir=str(output_dir), per_device_train_batch_size=4, num_generations=4,
                    max_completion_length=6, learning_rate=5e-3, max_steps=2, logging_steps=1, report_to=[],
                    save_strategy="no", use_cpu=True, bf16=False, fp16=False, seed=0, dataloader_num_workers=0)
    settings.update(config_overrides)
    dataset = Dataset.from_dict({"prompt": ["1+1=?", "2+3=?", "4+4=?", "9+0=?"] * 4})
    return trainer_class(model=model, reward_funcs=reward_short_digits, args=GRPOConfig(**settings),
                         train_dataset=dataset, processing_class=character_tokenizer(), peft_config=peft_config)


def labelled_batch(seed: int = 0):
    """[2, 7] input_ids from the seed and their labels, the first 3 positions (a prompt) -100."""
    input_ids = torch.randint(3, VOCAB_SIZE, (2, 7), generator=torch.Generator().manual_seed(seed))
    labels = input_ids.clone()
    labels[:, :3] = -100
    return input_ids, labels


def logits_path_logps(model, input_ids, labels, **forward_kwargs) -> torch.Tensor:
    """The reference for a patched model's log-probs: log_softmax of its own logits at labels[:, 1:], 0 at -100."""
    with torch.no_grad():
        logits = model(input_ids, **forward_kwargs).logits.float()
    targets = labels[:, 1:]
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
    return log_probs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * (targets != -100)
