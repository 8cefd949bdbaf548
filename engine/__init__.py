"""engine: a lean GRPO training loop on top of grpo_kernels (`grpo-engine train | eval | plot`).

    from engine.config import load_config
    from engine.trainer import train
    summary = train(load_config("examples/gsm8k_qwen_lora.yaml", {"run.max_steps": 10}))
"""

from .config import ConfigError, EngineConfig, load_config

__all__ = ["ConfigError", "EngineConfig", "load_config"]
