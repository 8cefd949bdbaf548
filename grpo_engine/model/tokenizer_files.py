"""The tokenizer as its files say, and its special tokens (pad, EOS, BOS, UNK) as the engine uses them.

Why here and not in transformers:
- AutoTokenizer picks the tokenizer class from config.json's model type even when tokenizer_config.json names the
  generic class (`TokenizersBackend`, `PreTrainedTokenizerFast`: "tokenizer.json as it is"), and a model type's
  class rebuilds the pipeline: a character tokenizer saved next to a Qwen2 model (the engine's own demo) loaded as
  Qwen2's byte-level BPE, which dropped every space, newline and unknown character without a word.
- a tokenizer class fills a role its files leave unset with its own default (Qwen2's `<|endoftext|>`), added as a
  new token past the model's vocabulary: a tokenizer without a pad token was refused as "tokens added to it?"
  instead of padding with its EOS as the engine does;
- a special token that ordinary text encodes to (`"pad_token": "1"`) is left out of every decoded completion (the
  rollout decodes with skip_special_tokens), so the reward functions scored text without any of its 1s, silently;
  an EOS id of generation_config.json that is ordinary text (one from another model's vocabulary) ended every
  completion at its first such character;
- no EOS at all failed inside the rollout (a tensor of None).
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any, Optional

# What tokenizer_config.json names when the tokenizer is tokenizer.json as it is (the second: transformers < 5).
GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
ROLES = ("pad_token", "eos_token", "bos_token", "unk_token")
# Text any prompt or completion may hold: every printable ASCII character alone, and a sentence of them.
ORDINARY_TEXT = [*string.printable, "The answer is 42, not 7.\n"]


class SpecialTokenError(ValueError):
    """A tokenizer whose special tokens the engine cannot use as they are: one line naming the token."""


def _content(value: Any) -> Optional[str]:
    """A token as tokenizer_config.json writes it: text, or an AddedToken's {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _settings(file: Path) -> dict:
    try:
        values = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # absent (model_files.py has refused one that is there and unreadable)
        return {}
    return values if isinstance(values, dict) else {}


def declared_roles(directory: Path) -> set[str]:
    """The roles the tokenizer's files set (tokenizer_config.json, special_tokens_map.json), to a token or null."""
    return {role for name in ("tokenizer_config.json", "special_tokens_map.json")
            for role in ROLES if role in _settings(directory / name)}


def is_generic(directory: Path) -> bool:
    """Whether the files say "tokenizer.json as it is": that file, and the generic class in tokenizer_config.json."""
    declared = _settings(directory / "tokenizer_config.json").get("tokenizer_class")
    return (directory / "tokenizer.json").is_file() and declared in GENERIC_CLASSES


def file_tokens(directory: Path) -> Optional[set[str]]:
    """Every token tokenizer.json holds (its model's vocabulary and its added tokens); None without that file."""
    try:
        saved = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
        vocab = saved["model"]["vocab"]
        tokens = {entry[0] if isinstance(entry, list) else entry for entry in vocab}  # Unigram: [piece, score]
        return tokens | {token["content"] for token in saved.get("added_tokens") or ()}
    except (OSError, ValueError, KeyError, TypeError, IndexError):  # a slow tokenizer's files: nothing to compare
        return None


def invented_roles(tokenizer: Any, directory: Path) -> list[str]:
    """The roles the files leave unset that the tokenizer's class filled with a token the files do not hold."""
    tokens = file_tokens(directory)
    if tokens is None:
        return []
    declared = declared_roles(directory)
    return [role for role in ROLES if role not in declared and getattr(tokenizer, role, None) is not None
            and str(getattr(tokenizer, role)) not in tokens]


DECODED_AWAY = ("completions are decoded without special tokens, so each one the model writes would be missing from "
                "the text the reward functions score; make it a token of its own (such as '<pad>') in "
                "tokenizer_config.json")
ENDS_COMPLETIONS = ("every completion would end at its first one; is generation_config.json (or config.json) from "
                    "another model?")


def _checked_ids(tokenizer: Any, directory: Path) -> dict[int, tuple[str, str]]:
    """{id: (what it is, why ordinary text must not encode to it)}: the tokenizer's special tokens (the UNK token
    aside: it stands for text the tokenizer has no token for, preflight.py's concern), the model's EOS ids."""
    unk = getattr(tokenizer, "unk_token_id", None)
    checked = {}
    for token_id in getattr(tokenizer, "all_special_ids", ()) or ():
        if token_id != unk:
            role = next((role for role in ROLES if getattr(tokenizer, f"{role}_id", None) == token_id),
                        "special token")
            checked[token_id] = (f"the tokenizer's {role} {tokenizer.convert_ids_to_tokens(token_id)!r}", DECODED_AWAY)
    file, eos = model_eos_ids(directory)
    for token_id in eos:
        checked.setdefault(token_id, (f"{file}'s eos_token_id", ENDS_COMPLETIONS))
    return checked


def ordinary_text_problem(tokenizer: Any, directory: Path) -> Optional[str]:
    """A special token or EOS id that ordinary text encodes to, in a few words, or None."""
    checked = _checked_ids(tokenizer, directory)
    if not checked:
        return None
    for text, ids in zip(ORDINARY_TEXT, tokenizer(ORDINARY_TEXT, add_special_tokens=False)["input_ids"]):
        found = next((token_id for token_id in ids if token_id in checked), None)
        if found is not None:
            what, why = checked[found]
            return f"{what} (id {found}) is ordinary text ({text!r:.30} encodes to it): {why}"
    return None


def model_eos_ids(directory: Path) -> tuple[str, list[int]]:
    """(the file, the EOS ids) generation_config.json or config.json names (model_files.py typed them), the first
    file that names any; ("", []) when neither does."""
    for name in ("generation_config.json", "config.json"):
        ids = _settings(directory / name).get("eos_token_id")
        ids = ids if isinstance(ids, list) else [ids]
        ids = [token_id for token_id in ids if isinstance(token_id, int) and not isinstance(token_id, bool)]
        if ids:
            return name, ids
    return "", []


def settle_special_tokens(tokenizer: Any, directory: Path) -> None:
    """The pad token when the files name none: the tokenizer's EOS, else the model's first EOS id's token (left
    padding is masked out, so any token the model has will do). SpecialTokenError when no EOS is named anywhere
    (no completion could end) or a special token or EOS id is ordinary text."""
    _, eos = model_eos_ids(directory)
    if tokenizer.eos_token is None and not eos:
        raise SpecialTokenError(f"the model in {str(directory)!r} names no EOS token (tokenizer_config.json's "
                                f"eos_token, generation_config.json's or config.json's eos_token_id), so no completion "
                                f"could end: set eos_token in tokenizer_config.json")
    problem = ordinary_text_problem(tokenizer, directory)
    if problem:
        raise SpecialTokenError(f"{problem} ({str(directory)!r})")
    if tokenizer.pad_token is None:  # after the check: a fallback to an EOS id is then named by its file
        pad = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.convert_ids_to_tokens(eos[0])
        if pad is None:  # the model's EOS id is past the tokenizer's tokens
            raise SpecialTokenError(f"the tokenizer in {str(directory)!r} names no pad or EOS token, and the model's "
                                    f"EOS id {eos[0]} is no token of it: set eos_token in tokenizer_config.json")
        tokenizer.pad_token = pad


def unknown_text(tokenizer: Any, text: str, ids: list[int]) -> Optional[str]:
    """The first piece of `text` the tokenizer encodes as its UNK token (it has no token for it: the model would see
    UNK where the reward functions see the text), quoted, or None; a text that writes the UNK token itself is fine."""
    unk_id, unk = getattr(tokenizer, "unk_token_id", None), getattr(tokenizer, "unk_token", None)
    if unk_id is None or unk_id not in ids or (isinstance(unk, str) and unk in text):
        return None
    try:  # a fast tokenizer says which characters became UNK
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        start, end = next(span for token_id, span in zip(encoded["input_ids"], encoded["offset_mapping"])
                          if token_id == unk_id)
        return repr(text[start:end][:20]) if end > start else "a character"
    except Exception:  # a slow tokenizer has no offsets: the fact without the place
        return "a character"
