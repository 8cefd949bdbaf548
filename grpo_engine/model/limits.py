"""What a loaded model can take, checked before any step: its weights all loaded, token ids inside its
vocabulary, prompts inside its positions, and the vocabulary rows no token of the tokenizer maps to.

Each of these otherwise fails late or not at all: a checkpoint whose config names another architecture loads
as a randomly initialised model (transformers only warns), a pad id past the embedding fails inside `generate`,
a prompt longer than the positions crashes a learned-position model or silently runs a RoPE model past its
trained range, and the padding rows of a vocabulary rounded up for the GPU (Qwen2.5: 151,936 rows for about
151,665 tokens) get sampled and decode to nothing.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

SCORED_VOCAB_ATTR = "grpo_scored_vocab_size"  # set on a causal LM whose padded rows are neither sampled nor scored


class ModelFitError(RuntimeError):
    pass


def check_loaded_weights(path: str, info: dict[str, Any]) -> None:
    """transformers' loading info: every weight of the architecture in the checkpoint, and nothing else there."""
    problems = []
    for key, meaning in (("missing_keys", "missing (would be randomly initialised)"),
                         ("unexpected_keys", "in the checkpoint but not in the architecture"),
                         ("mismatched_keys", "of another shape than the architecture's")):
        names = sorted(_weight_name(name) for name in info.get(key) or ())
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            problems.append(f"{len(names)} weights {meaning}: {shown}")
    if problems:
        raise ModelFitError(f"the weights in {path!r} do not match the architecture its config.json names "
                            f"({'; '.join(problems)}): is config.json from another model?")


def _weight_name(entry: Any) -> str:
    """A weight's name; a mismatched one comes as (name, the checkpoint's shape, the architecture's shape)."""
    if isinstance(entry, tuple) and len(entry) == 3:
        return f"{entry[0]} ({list(entry[1])} in the checkpoint, {list(entry[2])} by config.json)"
    return str(entry)


def embedding_rows(lm: torch.nn.Module) -> int:
    """The rows of the model's input embedding, read off its weight: with LoRA on the embeddings
    (model.lora.target_modules naming embed_tokens) it is peft's wrapper, which has the weight but no
    num_embeddings (an AttributeError once the run directory was written)."""
    return int(lm.get_input_embeddings().weight.shape[0])


def check_tokenizer_fits(tokenizer: Any, lm: torch.nn.Module, path: str) -> None:
    """Every id the tokenizer can produce, the pad and EOS ids included, has an embedding row."""
    check_tokenizer_within(tokenizer, embedding_rows(lm), path, "the model's embedding")


def check_tokenizer_within(tokenizer: Any, rows: int, path: str, holder: str) -> None:
    """Every id the tokenizer can produce, the pad and EOS ids included, is below the `rows` of `holder` (the
    loaded embedding, or before any weight loads the vocabulary config.json declares)."""
    if len(tokenizer) > rows:
        raise ModelFitError(f"the tokenizer in {path!r} has {len(tokenizer)} tokens but {holder} has {rows} rows: "
                            f"ids >= {rows} have no embedding{_tokens_past(tokenizer, rows)} (a tokenizer from "
                            f"another model, or tokens added to it?)")
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int) and not 0 <= value < rows:
            raise ModelFitError(f"the tokenizer's {name} is {value}, outside the {rows} rows of {holder} ({path!r})")


def _tokens_past(tokenizer: Any, rows: int) -> str:
    """The first tokens of ids >= `rows`, by name (a special token tokenizer_config.json names that its
    tokenizer.json lacks is added past the vocabulary as it loads): ', such as '</s>' (99)', or ''."""
    try:
        names = [(token_id, tokenizer.convert_ids_to_tokens(token_id)) for token_id in range(rows, len(tokenizer))[:3]]
    except Exception:  # a tokenizer without ids to names (a test double): the count alone
        return ""
    shown = ", ".join(f"{name!r} ({token_id})" for token_id, name in names if isinstance(name, str))
    return f", such as {shown}" if shown else ""


def scored_vocab_size(tokenizer: Any, lm: torch.nn.Module, sample_padded_vocab: bool) -> Optional[int]:
    """The number of leading vocabulary rows that sampling draws from and the loss scores over: the tokenizer's
    length when the model has padding rows past it (and the user did not ask for them); None for all rows."""
    if sample_padded_vocab:
        return None
    size = len(tokenizer)
    return size if size < embedding_rows(lm) else None


def restrict_vocabulary(lm: torch.nn.Module, size: Optional[int]) -> None:
    """Mark the causal LM (or the peft model around it) so its head is scored over its first `size` rows."""
    target = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    setattr(target, SCORED_VOCAB_ATTR, size)


def attention_head_size(model_config: Any) -> Optional[int]:
    """The size of one attention head, from a transformers config (its text part for a multimodal one)."""
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    size = getattr(text, "head_dim", None)
    if size is None and getattr(text, "num_attention_heads", None):
        size = text.hidden_size // text.num_attention_heads
    return size if isinstance(size, int) else None


def max_positions(lm: torch.nn.Module) -> Optional[int]:
    config = getattr(lm, "config", None)
    config = getattr(config, "text_config", None) or config
    value = getattr(config, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def check_prompts_fit(prompts: list[str], tokenizer: Any, lm: torch.nn.Module, max_prompt_length: Optional[int],
                      max_new_tokens: int, source: str) -> None:
    """Every prompt has a token, and the longest one (as truncated) plus max_new_tokens fits the positions."""
    lengths = [len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]] if prompts else []
    empty = next((i for i, n in enumerate(lengths) if n == 0), None)
    if empty is not None:
        raise ModelFitError(f"{source} row {empty}: the prompt is empty after tokenization ({prompts[empty]!r})")
    check_lengths_fit(lengths, max_positions(lm), max_prompt_length, max_new_tokens, source)


def check_lengths_fit(lengths: list[int], limit: Optional[int], max_prompt_length: Optional[int],
                      max_new_tokens: int, source: str) -> None:
    """The longest prompt of `lengths` tokens (as truncated) plus max_new_tokens fits `limit` positions (the
    loaded model's, or before any weight loads its config.json's); None: no limit known."""
    if limit is None or not lengths:
        return
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    prompt_tokens = min(lengths[longest], max_prompt_length) if max_prompt_length else lengths[longest]
    if prompt_tokens + max_new_tokens > limit:
        raise ModelFitError(
            f"{source} row {longest}: a prompt of {prompt_tokens} tokens plus rollout.max_new_tokens "
            f"({max_new_tokens}) is {prompt_tokens + max_new_tokens} positions, more than the model's "
            f"max_position_embeddings ({limit}); set data.max_prompt_length (prompts keep their end) or lower "
            f"rollout.max_new_tokens")
