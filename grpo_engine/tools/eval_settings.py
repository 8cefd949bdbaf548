"""The settings `grpo-engine eval` does not read, given as flags: each said in one warning line before the evaluation.

eval takes the whole config (so that a training config's data, rollout and rewards settings apply), but it trains
nothing, loads --model as it is, and decodes greedily unless it samples: a flag of a setting it does not read
(`--rollout.temperature 0.5` without --sample, `--data.split train` of a Hub dataset, whose data.eval_split is
scored, `--optim.learning_rate`) was taken and ignored without a word, and the user read the metrics as those of
what they asked for. Besides eval's own reasons below, the schema's read conditions (ReadWhen, the ones `train`
warns by) apply to the config as eval reads it: `--model.revision` of a local model, `--rewards.math_correct`
without math_accuracy. Every key of the schema is either in READ_BY_EVAL or given a reason here (a test holds it).
Imports no torch: checked before the evaluation starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Optional

from ..config import EngineConfig, is_hub_id
from ..config.applicability import declared_conditions
from ..config.schema import has_splits

# Why eval does not read a key (the longest matching prefix of the key decides)
_NEVER_READ = {
    "optim.": "eval trains nothing",
    "loss.": "eval trains nothing",
    "run.": "of the run section eval reads only run.seed, run.device and run.eval_num_samples",
    "model.lora.": "eval loads --model as it is (a LoRA directory's adapters are read from it)",
    "model.gradient_checkpointing": "eval trains nothing",
    "model.tensor_parallel": "eval runs in one process",
    "model.fsdp": "eval runs in one process",
    "data.split": "eval scores data.eval_split of a Hub dataset",
    "data.shuffle": "eval scores every prompt, in order",
    "rollout.num_generations": "eval generates --num-samples completions per prompt",
    "rollout.backend": "eval generates with Hugging Face generate on --model itself",
    "rollout.vllm.": "eval generates with Hugging Face generate on --model itself",
    "rollout.server.": "eval generates with Hugging Face generate on --model itself",
    "rollout.max_staleness": "eval generates with Hugging Face generate on --model itself",
    "rollout.importance_sampling": "eval trains nothing",
    "rollout.importance_sampling_cap": "eval trains nothing",
    "rewards.weights": "eval reports each reward function's mean apart (the weights make training's total reward)",
    "rewards.scale_rewards": "eval trains nothing (it scales training's advantages)",
    "rollout.replay_kept_tokens": "eval trains nothing",
    "rollout.mask_truncated_completions": "eval trains nothing (its metrics count every completion)",
}
_READ = ("run.seed", "run.device", "run.eval_num_samples")
# The keys eval reads (some under conditions: the sampling ones when it samples, the data ones for its data); a key
# of the schema outside these gets a reason above, or the schema's condition's
READ_BY_EVAL = (*_READ, "model.name_or_path", "model.revision", "model.dtype", "model.attn_implementation",
                "data.path", "data.eval_path", "data.config", "data.eval_split", "data.prompt_column",
                "data.system_prompt", "data.max_prompt_length", "data.max_prompt_chars", "data.builtin_max_operand",
                "data.builtin_eval_size", "rollout.max_new_tokens", "rollout.temperature", "rollout.top_p",
                "rollout.top_k", "rollout.repetition_penalty", "rollout.sample_padded_vocab", "rewards.functions",
                "rewards.answer_column", "rewards.math_correct", "rewards.math_wrong", "rewards.math_no_answer",
                "rewards.length_cache", "rewards.timeout_seconds")
_SAMPLING = ("rollout.temperature", "rollout.top_p", "rollout.top_k")
_HUB_DATA = ("data.config",)  # data.eval_split: read for a DatasetDict directory too
_BUILTIN_TASK = ("data.builtin_max_operand", "data.builtin_eval_size")
_DATA_FILE = ("data.max_prompt_chars",)


def _why_unread(key: str, greedy: bool, data_path: Optional[str]) -> Optional[str]:
    if key in _READ:
        return None
    if greedy and key in _SAMPLING:
        return "eval decodes greedily with one sample: add --sample or --num-samples K to sample"
    hub = data_path is not None and not Path(data_path).expanduser().exists() and is_hub_id(data_path)
    if key == "data.eval_split" and not has_splits(data_path):  # a DatasetDict directory's split is read too
        return "the evaluation data is neither a Hub dataset nor a DatasetDict directory"
    if key in _HUB_DATA and not hub:
        return "the evaluation data is not a Hub dataset"
    if key in _BUILTIN_TASK and data_path is not None:
        return "the evaluation data is a file, not the built-in task"
    if key in _DATA_FILE and data_path is None:
        return "the built-in task is scored, not a file"
    prefixes = [prefix for prefix in _NEVER_READ if key == prefix or prefix.endswith(".") and key.startswith(prefix)]
    return _NEVER_READ[max(prefixes, key=len)] if prefixes else None


def _schema_condition_unmet(key: str, config: EngineConfig, data_path: Optional[str]) -> Optional[str]:
    """The schema's condition for `key` that fails for the config as eval reads it (its data at data.path), or None."""
    conditions = dict(declared_conditions(EngineConfig)).get(key, ())
    evaluated = config.model_copy(update={"data": config.data.model_copy(update={"path": data_path,
                                                                                "eval_path": data_path})})
    failing = next((condition for condition in conditions if not condition.holds(evaluated)), None)
    return None if failing is None else f"it applies only with {failing.text}"


def unread_eval_flags(keys: Iterable[str], config: EngineConfig, greedy: bool,
                      data_path: Optional[str]) -> list[str]:
    """One line per dotted key of `keys` (the flags given) that this evaluation does not read: `greedy` when it
    decodes greedily, `data_path` the data it scores (None: the built-in task)."""
    notes = []
    for key in keys:
        why = _why_unread(key, greedy, data_path)
        if why is None and key not in _READ:
            why = _schema_condition_unmet(key, config, data_path)
        if why is not None:
            notes.append(f"--{key} {_value(config, key)!r} changes nothing in an evaluation: {why}")
    return notes


def _value(config: Any, key: str) -> Any:
    for part in key.split("."):
        config = getattr(config, part, None)
    return config
