"""The tiny model the vLLM tests serve: a 2-layer Qwen2 with the demo's character tokenizer and head size 32
(vLLM's CPU attention has no kernel for the demo model's 16)."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.data.demo_task import build_char_tokenizer


def save_model(path: Path, vocab_rows: int = 0, hidden_size: int = 64, layers: int = 2) -> Path:
    """Saved to `path`; `vocab_rows` > the tokenizer's 99 pads the vocabulary as Qwen2.5 does."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_char_tokenizer()
    config = Qwen2Config(vocab_size=max(vocab_rows, len(tokenizer)), hidden_size=hidden_size,
                         intermediate_size=2 * hidden_size, num_hidden_layers=layers,
                         num_attention_heads=hidden_size // 32, num_key_value_heads=1, max_position_embeddings=128,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
