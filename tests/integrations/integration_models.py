"""Tiny randomly initialised transformers models and an in-code tokenizer: no hub access anywhere."""

from __future__ import annotations

import string

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (GemmaConfig, GemmaForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

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
}


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
