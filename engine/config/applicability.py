"""Settings that take effect only under another setting's choice, in one table.

Set away from its default where it does not apply, such a setting would change nothing, silently: a server URL
with the local backend trains without the server, a LoRA rank without LoRA trains every weight. The run says so
at its start (`engine/run_setup.py`), one line per setting, naming what would make it apply. Not refused: a
YAML file may carry a section for another backend and still be right for this run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .schema import EngineConfig


@dataclass(frozen=True)
class AppliesOnlyWith:
    keys: tuple[str, ...]  # dotted keys, or section prefixes ending in "."
    applies: Callable[[EngineConfig], bool]
    condition: str  # what makes them apply, as a user would set it


RULES: tuple[AppliesOnlyWith, ...] = (
    AppliesOnlyWith(("rollout.server.",), lambda c: c.rollout.backend == "vllm_server",
                    "rollout.backend vllm_server"),
    AppliesOnlyWith(("rollout.vllm.",), lambda c: c.rollout.backend == "vllm", "rollout.backend vllm"),
    AppliesOnlyWith(("model.lora.r", "model.lora.alpha", "model.lora.dropout", "model.lora.target_modules"),
                    lambda c: c.model.lora.enabled, "model.lora.enabled true"),
    AppliesOnlyWith(("optim.max_tokens_per_micro_batch",), lambda c: c.optim.padding_free,
                    "optim.padding_free true"),
    AppliesOnlyWith(("loss.sapo_temperature_pos", "loss.sapo_temperature_neg"),
                    lambda c: c.loss.loss_type == "sapo", "loss.loss_type sapo"),
    AppliesOnlyWith(("loss.vespo_k_pos", "loss.vespo_lambda_pos", "loss.vespo_k_neg", "loss.vespo_lambda_neg"),
                    lambda c: c.loss.loss_type == "vespo", "loss.loss_type vespo"),
    AppliesOnlyWith(("rewards.math_correct", "rewards.math_wrong", "rewards.math_no_answer"),
                    lambda c: "math_accuracy" in c.rewards.functions, "math_accuracy in rewards.functions"),
    AppliesOnlyWith(("rewards.length_cache",), lambda c: "length" in c.rewards.functions,
                    "length in rewards.functions"),
    AppliesOnlyWith(("data.builtin_max_operand", "data.builtin_eval_size"), lambda c: c.data.path is None,
                    "data.path null (the built-in addition task)"),
    AppliesOnlyWith(("data.eval_split",), lambda c: c.data.eval_path is not None, "data.eval_path set"),
    AppliesOnlyWith(("rollout.importance_sampling_cap",),
                    lambda c: c.rollout.importance_sampling_mode() is not None,
                    "an off-policy correction in force (rollout.importance_sampling, or max_staleness >= 1)"),
    AppliesOnlyWith(("run.warm_start_learning_rate", "run.warm_start_target"), lambda c: c.run.warm_start_steps > 0,
                    "run.warm_start_steps > 0"),
)


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and key != "params":
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def covered(rule: AppliesOnlyWith, key: str) -> bool:
    return any(key == name or (name.endswith(".") and key.startswith(name)) for name in rule.keys)


def inapplicable_settings(config: EngineConfig, defaults: EngineConfig) -> list[str]:
    """One line per setting that differs from `defaults` (the schema's, with the run's preset) where it does not
    apply."""
    now, default = _flat(config.model_dump()), _flat(defaults.model_dump())
    notes = []
    for rule in RULES:
        if rule.applies(config):
            continue
        for key, value in now.items():
            if covered(rule, key) and value != default.get(key):
                notes.append(f"{key} is set ({value!r}) but applies only with {rule.condition}: it changes nothing "
                             f"in this run")
    return notes
