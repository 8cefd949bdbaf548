"""The pre-flight: every constraint between the settings, the data and the machine, evaluated before any model
weight loads (and before the run directory is written), each refused in one line naming the setting or the row.

The schema holds what the settings alone decide (bounds, signs, the seed's domain, rules across keys). What needs
the data or the model's shape is decided here, from what loads without weights: the tokenizer and the model's
config.json (the built-in model's from code). A refusal here costs no model load; a run that passes does not
fail later on any of these:

- the tokenizer's ids (its length, its pad / EOS / BOS ids) inside the vocabulary config.json declares, and
  rollout.top_k below it;
- every prompt, as rendered (chat template, system prompt), is text the tokenizer can encode (no lone UTF-16
  surrogate: not Unicode, which a tokenizer's UTF-8 encoder refuses; no character it has no token for, which it
  would read as its UNK token) and has at least one token that is not a special token;
- the longest prompt in tokens (truncated to data.max_prompt_length) plus rollout.max_new_tokens fits the
  model's positions, the packing budget (optim.max_tokens_per_micro_batch) and vLLM's rollout.vllm.max_model_len;
- (the seeds: run.seed's domain is the schema's; a backend that derives more seeds from it checks them in its
  registry entry's `check`, which runs before this.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from .config import EngineConfig, RolloutConfig
from .data.row_values import unencodable
from .model.limits import ModelFitError, check_tokenizer_within
from .model.tokenizer_files import unknown_text
from .rollout.registry import rollout_backend


class PreflightError(ValueError):
    """A constraint between the settings, the data and the machine that does not hold: one line naming it."""


def model_config_of(base_path: Optional[str], tokenizer: Any) -> Any:
    """The model's config (no weights): config.json of `base_path`, or the built-in model's."""
    if base_path is None:
        from .data.demo_task import tiny_model_config

        return tiny_model_config(tokenizer)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(base_path)
    except (OSError, ValueError):  # an adapter-only directory: the checks after loading see the model itself
        return None


def model_positions(model_config: Any) -> Optional[int]:
    text = getattr(model_config, "text_config", None) or model_config
    value = getattr(text, "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def vocabulary_rows(model_config: Any) -> Optional[int]:
    """The embedding rows the model's config declares (its text model's, for a multimodal config), or None."""
    text = getattr(model_config, "text_config", None) or model_config
    value = getattr(text, "vocab_size", None)
    return value if isinstance(value, int) and value > 0 else None


def check_tokenizer_vocabulary(tokenizer: Any, model_config: Any, path: str) -> None:
    """The tokenizer's ids inside the vocabulary the model's config declares (nothing to check without a config)."""
    rows = vocabulary_rows(model_config)
    if rows is None:
        return
    try:
        check_tokenizer_within(tokenizer, rows, path, "config.json's vocab_size")
    except ModelFitError as exc:
        raise PreflightError(str(exc)) from None


def check_top_k_within_vocabulary(rollout: RolloutConfig, tokenizer: Any, model_config: Any) -> None:
    """rollout.top_k below the tokens the model samples from (its rows; less the padded ones past the tokenizer's
    last token unless rollout.sample_padded_vocab). One at least as large keeps every token and truncates nothing,
    yet training records and replays each position's kept set at the width of the whole vocabulary: on a 152k-token
    model, about 20 GB of ids for 64 completions of 256 tokens. The schema cannot tell: it knows no vocabulary."""
    rows = vocabulary_rows(model_config)
    if rows is None or rollout.top_k == 0:
        return
    tokens = rows if rollout.sample_padded_vocab else min(rows, len(tokenizer))
    if rollout.top_k >= tokens:
        raise PreflightError(f"rollout.top_k ({rollout.top_k}) is at least the {tokens} tokens the model samples "
                             f"from: it keeps every one and truncates nothing; set 0 (off) or fewer than {tokens}")


def _tokenizer(base_path: Optional[str]) -> Any:
    if base_path is None:
        from .data.demo_task import build_char_tokenizer

        return build_char_tokenizer()
    from .model.loading import load_tokenizer

    return load_tokenizer(base_path)


def prompt_lengths(prompts: Sequence[str], tokenizer: Any, source: str) -> list[int]:
    """Tokens of each prompt; PreflightError naming the row the tokenizer cannot encode or leaves empty."""
    for row, text in enumerate(prompts):
        problem = unencodable(text)
        if problem is not None:
            raise PreflightError(f"{source} row {row}: the prompt holds {problem}, which the tokenizer cannot "
                                 f"encode; fix or drop the row")
    try:
        encoded = tokenizer(list(prompts), add_special_tokens=False)["input_ids"] if prompts else []
    except Exception:  # a tokenizer's own refusal, of any type: found and named by its row
        encoded = [_encoded(tokenizer, text, f"{source} row {row}") for row, text in enumerate(prompts)]
    empty = next((row for row, ids in enumerate(encoded) if not ids), None)
    if empty is not None:
        raise PreflightError(f"{source} row {empty}: the prompt is empty after tokenization ({prompts[empty]!r:.60})")
    # A text prompt is taken as written, its special tokens included; one of nothing else (`<pad>`, `<eos><eos>`)
    # gives the model no text to answer: it trained on a prompt of padding, silently.
    special = set(getattr(tokenizer, "all_special_ids", None) or ())
    markup = next((row for row, ids in enumerate(encoded) if special and set(ids) <= special), None)
    if markup is not None:
        raise PreflightError(f"{source} row {markup}: the prompt is only the tokenizer's special tokens "
                             f"({prompts[markup]!r:.60}), no text for the model to answer; fix or drop the row")
    for row, (text, ids) in enumerate(zip(prompts, encoded)):
        unknown = unknown_text(tokenizer, text, ids)
        if unknown is not None:
            raise PreflightError(f"{source} row {row}: the tokenizer has no token for {unknown} in the prompt (it "
                                 f"reads it as {tokenizer.unk_token!r}, so the model would not see it); replace that "
                                 f"text or drop the row")
    return [len(ids) for ids in encoded]


def _encoded(tokenizer: Any, text: str, where: str) -> list[int]:
    try:
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    except Exception as exc:
        raise PreflightError(f"{where}: the tokenizer cannot encode the prompt ({type(exc).__name__}: "
                             f"{' '.join(str(exc).split())[:120]})") from None


def longest_sequence_limits(config: EngineConfig, positions: Optional[int]) -> list[tuple[int, str]]:
    """(tokens, what holds them) for every bound on one prompt + completion, from the settings and the model."""
    limits = []
    if positions is not None:
        limits.append((positions, "the model's max_position_embeddings"))
    budget = config.optim.max_tokens_per_micro_batch
    if config.optim.padding_free and budget is not None:
        limits.append((budget, "optim.max_tokens_per_micro_batch (one pack)"))
    if rollout_backend(config.rollout.backend).section == "vllm" and config.rollout.vllm.max_model_len is not None:
        limits.append((config.rollout.vllm.max_model_len, "rollout.vllm.max_model_len"))
    return limits


def check_sequences_fit(config: EngineConfig, lengths: list[int], positions: Optional[int], source: str) -> None:
    if not lengths:
        return
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    cap = config.data.max_prompt_length
    prompt = min(lengths[longest], cap) if cap is not None else lengths[longest]
    total = prompt + config.rollout.max_new_tokens
    for limit, what in longest_sequence_limits(config, positions):
        if total > limit:
            raise PreflightError(
                f"{source} row {longest}: a prompt of {prompt} tokens plus rollout.max_new_tokens "
                f"({config.rollout.max_new_tokens}) is {total} tokens, more than {what} ({limit}); set "
                f"data.max_prompt_length (prompts keep their end) or lower rollout.max_new_tokens")


def check_lora_targets(config: EngineConfig, model_config: Any) -> None:
    """model.lora.target_modules against the modules of the model config.json describes (built on the meta
    device: no weights), as peft will match them."""
    from .model.lora_targets import lora_targets_problem, model_skeleton

    if not config.model.lora.enabled or model_config is None:
        return
    skeleton = model_skeleton(model_config)
    problem = None if skeleton is None else lora_targets_problem(skeleton, config.model.lora.target_modules)
    if problem:
        raise PreflightError(problem)


def check_whole_model(base_path: Optional[str]) -> None:
    """train starts from a whole model: an adapter directory (what a LoRA run's checkpoints hold) was "no
    config.json: not a Hugging Face model directory" once the run directory was written."""
    from .model.loading import adapter_base

    if base_path is not None and all((Path(base_path) / name).is_file() for name in ("config.json",
                                                                                   "adapter_config.json")):
        # transformers then loads the base model adapter_config.json names with its adapters, not the weights here:
        # it failed once the run directory was written ("No such file ... adapter_model.safetensors")
        raise PreflightError(f"model directory {base_path!r} holds a whole model (config.json) and an "
                             f"adapter_config.json, which transformers would load in its place (LoRA adapters on "
                             f"the base model it names): move adapter_config.json out of the model directory")
    base = None if base_path is None else adapter_base(base_path)
    if base is not None:
        raise PreflightError(f"model directory {base_path!r} holds LoRA adapters (adapter_config.json), not a whole "
                             f"model: train starts from their base model ({base!r}), with model.lora.enabled true to "
                             f"train new adapters; to go on training these, --resume the run that wrote them")


def truncation_note(lengths: list[int], max_prompt_length: Optional[int], prompts: str) -> Optional[str]:
    """One line saying how many prompts data.max_prompt_length cuts (they keep their end), or None when it cuts
    none. TRL cuts them without a word; a bound below the prompts' template and question left the model a prompt
    of its last tokens alone (at 1, every prompt was one token), trained on without a word."""
    if max_prompt_length is None:
        return None
    cut = [row for row, length in enumerate(lengths) if length > max_prompt_length]
    if not cut:
        return None
    longest = max(cut, key=lengths.__getitem__)
    share = "every one" if len(cut) == len(lengths) else f"{len(cut)} of the {len(lengths)}"
    return (f"data.max_prompt_length {max_prompt_length} cuts {share} of the {prompts} to their last "
            f"{max_prompt_length} token{'s' * (max_prompt_length != 1)} (row {longest}: {lengths[longest]} tokens); the model does not see what is "
            f"cut off, so raise data.max_prompt_length where the question or its instructions come first")


def preflight(config: EngineConfig, rows: list[dict], eval_rows: list[dict], base_path: Optional[str]) -> list[str]:
    """Every constraint between settings, data and machine, before any weight loads. `base_path`: the model
    directory (None: the built-in model, built in code later). Returns the notes for the start of the run: what
    the data makes of the settings without making the run impossible."""
    from .data.prompts import render_prompts

    tokenizer = _tokenizer(base_path)
    check_whole_model(base_path)
    model_config = model_config_of(base_path, tokenizer)
    check_lora_targets(config, model_config)
    positions = model_positions(model_config)
    check_tokenizer_vocabulary(tokenizer, model_config, base_path or "the built-in model")
    check_top_k_within_vocabulary(config.rollout, tokenizer, model_config)
    d = config.data
    notes = []
    for data, source, kind in ((rows, d.path, "training"), (eval_rows, d.eval_path, "evaluation")):
        where = f"dataset {source!r}" if source else "the built-in task"
        prompts = render_prompts(data, d.prompt_column, tokenizer, d.system_prompt, where)
        lengths = prompt_lengths(prompts, tokenizer, where)
        check_sequences_fit(config, lengths, positions, where)
        notes.append(truncation_note(lengths, d.max_prompt_length, f"{kind} prompts of {where}"))
    return [note for note in notes if note is not None]
