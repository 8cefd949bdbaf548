"""A config from its layers: the defaults, a preset, a YAML file, then dotted-key overrides (the flags),
validated once by the schema; and the saved form of a config (config.yaml), which reads back equal."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ValidationError

from ..rollout.registry import VLLM_INSTALL_HINT, rollout_backend  # noqa: F401 (VLLM_INSTALL_HINT: re-exported)
from .errors import ConfigError, describe
from .python_overrides import config_path, dotted_overrides
from .schema import MAX_SEED, SHARED_SETTINGS, EngineConfig, is_hub_id, local_data_path, user_path
from .strict_yaml import dump_yaml, parse_yaml, read_yaml


def config_from_dict(data: Optional[dict]) -> EngineConfig:
    """Build and validate an EngineConfig from a nested mapping (YAML content plus overrides)."""
    try:
        return EngineConfig.model_validate(data or {})
    except ValidationError as exc:
        raise ConfigError(describe(exc, EngineConfig, SHARED_SETTINGS)) from None


def deep_merge(base: dict, overlay: dict) -> dict:
    """`overlay` on top of `base`, section by section (neither input is modified)."""
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def apply_overrides(data: dict, overrides: dict[str, Any]) -> dict:
    """Set dotted keys ({"run.max_steps": 5}) in a nested mapping (returns a new mapping)."""
    result = deep_merge({}, data)
    for dotted, value in overrides.items():
        section = result
        *parents, leaf = dotted.split(".")
        for depth, part in enumerate(parents, 1):
            existing = section.get(part)
            if existing is None:
                existing = section[part] = {}
            elif not isinstance(existing, dict):
                # the schema's words for the same value without a flag into it
                raise ConfigError(f"{'.'.join(parents[:depth])}: expected a mapping of keys, got "
                                  f"{_shown(existing)} (--{dotted} sets a key inside it)")
            else:
                existing = section[part] = dict(existing)
            section = existing
        section[leaf] = value
    return result


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def empty_sections_read_empty(data: dict, model: type[BaseModel] = EngineConfig) -> dict:
    """`data` with each section written with no keys under it (`run:` whose keys are all commented out: YAML's null)
    as an empty mapping: it sets nothing. It was "run: expected a mapping of keys, got None" (a flag into it,
    --run.max_steps, already read it as empty); merged as null over a preset, it would have dropped the preset's
    section."""
    result = dict(data)
    for name, field in model.model_fields.items():
        section = field.annotation
        if not (isinstance(section, type) and issubclass(section, BaseModel)) or name not in result:
            continue
        if result[name] is None:
            result[name] = {}
        elif isinstance(result[name], dict):
            result[name] = empty_sections_read_empty(result[name], section)
    return result


def resolve_data_paths(data: dict, base: Path) -> dict:
    """Relative data paths in a YAML file name files next to it, wherever the command runs from."""
    section = data.get("data")
    if not isinstance(section, dict):
        return data
    resolved = dict(section)
    for key in ("path", "eval_path"):
        value = resolved.get(key)
        # A Hub id stays an id unless a file of that name stands next to the YAML file. A blank value stays as
        # written, for the schema to refuse as the flag's is: joined, `path: ''` named the YAML file's directory.
        local = isinstance(value, str) and value.strip() != "" and not user_path(value).is_absolute()
        if local and (not is_hub_id(value) or (base / value).exists() or local_data_path(value)):
            resolved[key] = str(base / value)
    return {**data, "data": resolved}


def load_config(path: Optional[str | Path] = None, overrides: Optional[dict] = None,
                preset: Optional[dict] = None) -> EngineConfig:
    """YAML file (optional) + dotted-key overrides, layered over `preset` (optional), then validated. Overrides may
    also nest (`{"run": {"max_steps": 10}}`: the keys it holds) and hold Python values (python_overrides.py)."""
    path = config_path(path)
    data = resolve_data_paths(empty_sections_read_empty(read_yaml(path)), Path(path).parent) if path is not None else {}
    data = apply_overrides(data, dotted_overrides(overrides))
    config = config_from_dict(deep_merge(preset or {}, data))
    validate_rollout_backend(config)
    return config


def config_as_loaded(config: Any) -> EngineConfig:
    """`config` checked again as a load checks it: train() is given what the caller holds, which may not be what
    load_config returned (a dict, a path, a config built with model_construct or model_copy(update=...), which
    skip validation, or one whose sections were set so that a rule across them no longer holds)."""
    if not isinstance(config, EngineConfig):
        raise ConfigError(f"train(config): expected an EngineConfig (load_config(path, overrides) makes one), got "
                          f"{type(config).__name__}")
    # warnings=False: a section replaced by a mapping would warn while dumped (an error under -W error)
    checked = config_from_dict(config.model_dump(warnings=False))
    validate_rollout_backend(checked)
    return checked


def validate(config: EngineConfig, num_processes: Optional[int] = None) -> None:
    """The rules that need the number of processes, checked when it is known (the trainer does so at start),
    so a config meant for 8 GPUs still loads on a laptop. Every other rule holds by construction."""
    r, o = config.rollout, config.optim
    last_seed = config.run.seed + (num_processes or 1) - 1
    if last_seed > MAX_SEED:
        # Each process seeds its RNGs with run.seed + its index: past NumPy's domain the last one stopped with
        # NumPy's "Seed must be between 0 and 2**32 - 1", naming no setting, after the model had loaded.
        raise ConfigError(f"run.seed ({config.run.seed}): each of the {num_processes} processes seeds its RNGs with "
                          f"run.seed + its index, up to {last_seed}, past {MAX_SEED}, the RNGs' largest seed; set "
                          f"run.seed at most {MAX_SEED - num_processes + 1}")
    batch = config.generation_batch_size(num_processes or 1)
    if num_processes is not None and batch % r.num_generations:
        raise ConfigError(
            f"the generation batch (optim.per_device_train_batch_size {o.per_device_train_batch_size} x "
            f"optim.gradient_accumulation_steps {o.gradient_accumulation_steps} x {num_processes} processes "
            f"= {batch} completions) must be divisible by rollout.num_generations ({r.num_generations})")


def validate_rollout_backend(config: EngineConfig) -> None:
    """What the rollout backend's registry entry needs installed (vLLM for vllm), said before anything loads."""
    rollout_backend(config.rollout.backend).check_installed()


def config_yaml(config: EngineConfig) -> str:
    """The saved form of a config: every key, in the schema's order; `config_from_yaml` reads it back equal."""
    return dump_yaml(config.model_dump())


def config_from_yaml(text: str, source: str) -> EngineConfig:
    data = parse_yaml(text, source)
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must hold a mapping of sections, got {type(data).__name__}")
    return config_from_dict(data)
