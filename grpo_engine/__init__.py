"""grpo_engine: a lean GRPO training loop on top of grpo_kernels (`grpo-engine train | eval | plot`).

    from grpo_engine.config import load_config
    from grpo_engine.trainer import train
    summary = train(load_config("examples/gsm8k_qwen_lora.yaml", {"run.max_steps": 10}))
"""

from __future__ import annotations

from typing import Any

from .import_path import libraries_first

libraries_first()  # under `python -m`, before anything imports a library a working directory's file could hide
__all__ = ["ConfigError", "EngineConfig", "load_config"]


def __getattr__(name: str) -> Any:
    # Imported on first use: `grpo-engine` first checks that the engine extra (pydantic, pyyaml, ...) is installed.
    if name in __all__:
        from . import config

        return getattr(config, name)
    raise AttributeError(f"module 'grpo_engine' has no attribute {name!r}")
