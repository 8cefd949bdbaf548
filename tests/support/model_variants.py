"""Copies of a saved tiny model (the engine tests' `tiny_model_dir`: the built-in Qwen2 with its character tokenizer,
99 tokens, 99 embedding rows, 128 positions, one token per character) whose config.json declares other limits, or
whose tokenizer holds added tokens: what the checks before any weight loads read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional


def model_variant(saved: Path, where: Path, vocab_size: Optional[int] = None, positions: Optional[int] = None,
                  added: int = 0) -> tuple[str, int]:
    """A copy of `saved` at `where` declaring `vocab_size` rows and `positions` positions (None: as saved), its
    tokenizer with `added` tokens more; (its path, the tokenizer's length)."""
    from transformers import AutoTokenizer

    shutil.copytree(saved, where)
    config = json.loads((where / "config.json").read_text())
    changed = {key: value for key, value in (("vocab_size", vocab_size), ("max_position_embeddings", positions))
               if value is not None}
    (where / "config.json").write_text(json.dumps({**config, **changed}))
    tokenizer = AutoTokenizer.from_pretrained(where)
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(added)])
    tokenizer.save_pretrained(where)
    return str(where), len(tokenizer)


def check_taken_or_refused(directory: Path, file: str, key: str, value: object, valid: bool) -> None:
    """The model directory's checks before any weight loads, with `file`'s `key` set to `value`: taken if `valid`;
    else refused in one line naming the file and the key. Of a valid type and range, only transformers' own rule for
    the architecture may refuse it (Qwen2's config.json takes no list of BOS ids, nor more layers than its
    layer_types lists), in its words, which name the key too."""
    from grpo_engine.model.loading import ModelLoadError, check_model_dir

    try:
        check_model_dir(str(directory))
    except ModelLoadError as exc:
        message = str(exc)
        assert "\n" not in message and file in message and key in message, (key, value, message)
        assert not valid or "a configuration transformers accepts" in message, f"refused {key}={value!r}: {message}"
        return
    assert valid, f"took {file} {key}={value!r}"
