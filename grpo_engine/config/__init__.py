"""The engine's configuration: one typed schema (schema.py) from which the YAML loader, the `--section.key`
flags, `--help`, the saved config.yaml and every error message are derived."""

from .errors import ConfigError
from .flags import flag_value, key_help, leaf_fields, leaf_keys
from .loading import (
    VLLM_INSTALL_HINT,
    apply_overrides,
    config_from_dict,
    config_from_yaml,
    config_yaml,
    deep_merge,
    load_config,
    resolve_data_paths,
    validate,
    validate_rollout_backend,
)
from .schema import (
    ROLLOUT_BACKENDS,
    SHARED_SETTINGS,
    DataConfig,
    EngineConfig,
    LoraConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    RewardsConfig,
    RolloutConfig,
    RunConfig,
    VLLMConfig,
    is_hub_id,
)
from .strict_yaml import parse_yaml, read_yaml

__all__ = [
    "ROLLOUT_BACKENDS", "SHARED_SETTINGS", "VLLM_INSTALL_HINT", "ConfigError", "DataConfig",
    "EngineConfig", "LoraConfig", "LossConfig", "ModelConfig", "OptimConfig", "RewardsConfig", "RolloutConfig",
    "RunConfig", "VLLMConfig", "apply_overrides", "config_from_dict", "config_from_yaml", "config_yaml",
    "deep_merge", "flag_value", "is_hub_id", "key_help", "leaf_fields", "leaf_keys", "load_config", "parse_yaml",
    "read_yaml", "resolve_data_paths", "validate", "validate_rollout_backend",
]
