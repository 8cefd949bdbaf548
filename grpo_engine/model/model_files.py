"""The files of a model directory, checked before transformers reads them: each one the loaders open is a regular
file, the small JSON files are JSON objects holding finite numbers, and config.json is a configuration transformers
accepts. Each refusal is one line naming the file.

Why here and not in transformers' errors: a `tokenizer.json` that is a directory is skipped silently (an empty
tokenizer, every prompt "empty after tokenization"); `"rms_norm_eps": NaN` (Python's json reads it) loads and
generates NaN; an out-of-range value raises huggingface_hub's StrictDataclassClassValidationError, whose message
spans lines and which is no OSError or ValueError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from ..data.row_values import RowValueError, strict_json_hooks
from .config_values import config_values_problem, layer_kinds_problem
from .generation_file import (GenerationSettings, TokenIdSettings, TokenizerSettings, settings_problem,
                              vocab_size_of)
from .weight_files import weight_files_problem
from ..state.bounded_read import FileBoundError, read_bounded_bytes, parse_json, special_file_kind

# What the loaders open in a model directory, by name or by suffix.
MODEL_FILE_SUFFIXES = (".json", ".jinja", ".safetensors", ".bin", ".model", ".txt", ".pt", ".pth")
# The small JSON files read whole (tokenizer.json, megabytes, is parsed by the tokenizers library, which refuses
# NaN itself).
CONFIG_FILES = ("config.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json",
                "adapter_config.json", "preprocessor_config.json")
CONFIG_FILE_BYTES = 16 << 20
# The index of a sharded checkpoint, by the single weights file transformers reads instead when there is one.
WEIGHT_INDEXES = {"model.safetensors.index.json": "model.safetensors",
                  "pytorch_model.bin.index.json": "pytorch_model.bin"}


class WeightIndex(BaseModel):
    """What transformers reads of a weight index: `metadata` (an object, {} will do) and the file of each weight."""

    model_config = ConfigDict(extra="allow")

    metadata: dict
    weight_map: Annotated[dict[StrictStr, StrictStr], Field(min_length=1)]


class ModelFileError(ValueError):
    """A file of a model directory that the loaders would misread: one line naming it."""


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def check_model_files(directory: Path) -> None:
    """Every file of `directory` a loader opens is a regular file; its small JSON files read as objects of finite
    numbers; config.json is one transformers can build a configuration from."""
    for entry in sorted(directory.iterdir()):
        if not entry.name.endswith(MODEL_FILE_SUFFIXES):
            continue
        if entry.is_symlink() and not entry.exists():
            raise ModelFileError(f"{entry} is a link to {entry.readlink()}, which does not exist")
        kind = "a directory" if entry.is_dir() else special_file_kind(entry)
        if kind is not None:
            raise ModelFileError(f"{entry} is {kind}, not a regular file: the model's loaders read it as a file")
    settings = {name: _json_object(directory / name) for name in CONFIG_FILES if (directory / name).is_file()}
    _check_token_settings(directory, settings)
    _check_weight_indexes(directory)
    problem = config_values_problem(settings["config.json"]) if "config.json" in settings else None
    if problem:
        raise ModelFileError(f"{directory / 'config.json'}: {problem}")
    if (directory / "config.json").is_file():
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(directory)
        except Exception as exc:  # transformers' and huggingface_hub's validation errors, of several types
            raise ModelFileError(f"{directory / 'config.json'} is not a configuration transformers accepts "
                                 f"({_one_line(exc)})") from None
        problem = layer_kinds_problem(config) or causal_lm_problem(config)  # what transformers built: its rules applied
        if problem:
            raise ModelFileError(f"{directory / 'config.json'}: {problem}")
        problem = weight_files_problem(directory, config)
        if problem:
            raise ModelFileError(problem)


def causal_lm_problem(config: object) -> Optional[str]:
    """Why AutoModelForCausalLM, the engine's loader, has no class for the configuration, or None. The load said it
    after the run directory was written, in transformers' words cut off inside its list of a few hundred classes."""
    from transformers import AutoModelForCausalLM

    if type(config) in AutoModelForCausalLM._model_mapping:
        return None
    kind = ("an encoder-decoder model" if getattr(config, "is_encoder_decoder", False)
            else "not a text generation model")
    return (f"model_type {getattr(config, 'model_type', None)!r} has no causal language model class in transformers "
            f"(AutoModelForCausalLM), {kind}: the engine trains decoder-only models such as Llama, Qwen2, Mistral")


def _json_object(path: Path) -> dict:
    try:
        value = parse_json(read_bounded_bytes(path, CONFIG_FILE_BYTES, "a model's configuration file"),
                           str(path), **strict_json_hooks())
    except (RowValueError, FileBoundError) as exc:
        raise ModelFileError(f"{path}: {exc}") from None
    except ValueError as exc:  # json's own error, UnicodeDecodeError
        raise ModelFileError(f"{path} is not valid JSON ({_one_line(exc)})") from None
    if not isinstance(value, dict):
        raise ModelFileError(f"{path} holds a JSON {type(value).__name__}, not an object of settings")
    return value


def _check_weight_indexes(directory: Path) -> None:
    """The index of sharded weights transformers reads (when the single weights file is absent): its keys of their
    types, and every shard it names a file of the directory. transformers failed with "KeyError: 'metadata'" on an
    index without that key, and a TypeError or AttributeError on a weight_map of another shape."""
    for name, single in WEIGHT_INDEXES.items():
        path = directory / name
        if not path.is_file() or (directory / single).is_file():  # transformers reads the single file first
            continue
        problem = settings_problem(_json_object(path), WeightIndex, None)
        if problem:
            raise ModelFileError(f"{path}: {problem}")
        shards = sorted(set(_json_object(path)["weight_map"].values()))
        missing = [shard for shard in shards if not (directory / shard).is_file()]
        if missing:
            raise ModelFileError(f"{path} names {len(missing)} of its {len(shards)} weight files that the directory "
                                 f"does not hold ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): "
                                 f"copy them next to it")


def _check_token_settings(directory: Path, settings: dict[str, dict]) -> None:
    """config.json's special token ids (its text part's too) and generation_config.json's settings, each of its type
    and range, every token id inside config.json's vocabulary (transformers only warns of one outside it)."""
    config = settings.get("config.json", {})
    vocab_size = vocab_size_of(config)
    parts = [("config.json", config, TokenIdSettings)]
    if isinstance(config.get("text_config"), dict):
        parts.append(("config.json text_config", config["text_config"], TokenIdSettings))
    if "generation_config.json" in settings:
        parts.append(("generation_config.json", settings["generation_config.json"], GenerationSettings))
    if "tokenizer_config.json" in settings:
        parts.append(("tokenizer_config.json", settings["tokenizer_config.json"], TokenizerSettings))
    for where, values, schema in parts:
        problem = settings_problem(values, schema, vocab_size)
        if problem:
            file, _, part = where.partition(" ")
            raise ModelFileError(f"{directory / file}: {part + '.' if part else ''}{problem}")
