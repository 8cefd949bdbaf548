"""The tiny model the vLLM server tests serve: grpo_engine.tools.rollout_speed's random Qwen2 (head size 32, the
demo's character tokenizer), saved to a directory."""

from __future__ import annotations

from pathlib import Path

from grpo_engine.tools.rollout_speed import build_model


def save_model(path: Path, vocab_rows: int = 0, hidden_size: int = 64, layers: int = 2) -> Path:
    """Saved to `path`; `vocab_rows` > the tokenizer's 99 pads the vocabulary as Qwen2.5 does."""
    build_model(str(path), hidden_size, layers, seed=0, vocab_rows=vocab_rows)
    return path
