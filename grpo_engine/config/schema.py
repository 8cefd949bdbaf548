"""The engine's configuration schema: every key with its type, range, default and meaning, and the rules
across keys, declared once (pydantic v2). The YAML loader, the `--section.key` flags, `--help`, the saved
config.yaml and every error message are derived from it.

Defaults follow TRL's GRPOConfig where TRL has one (lr 1e-6, 8 generations, 256 new tokens, temperature 1,
beta 0, epsilon 0.2, dapo loss, group-scaled rewards, max_grad_norm 1.0); the loss section's defaults are
read from the kernels' own `GRPOLossConfig`.

Settings the rollout and the loss share live in one place: the loss scores at `rollout.temperature` and the
loss types with a fixed normaliser divide by `rollout.max_new_tokens` (SHARED_SETTINGS).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import threading
import typing
import warnings
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Optional, Union

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo,
                      create_model, field_validator, model_validator)

from grpo_kernels.backends import backend_names
from grpo_kernels.config import MAX_TEMPERATURE, MIN_TEMPERATURE, GRPOLossConfig, LossConfigWarning, LossSetting
from grpo_kernels.losses import (DEFAULT_LOSS_TYPE, FLOAT32_MAX, TRUST_REGION, get_loss_type, loss_param_aliases,
                                 loss_type_names)

from .errors import ConfigError, describe, unknown_key_message
from .plain_values import plain_value
from .applicability import ReadWhen, read_when_any, read_when_is, read_when_listed, read_when_positive, value_at
from ..rollout.registry import (DEFAULT_ROLLOUT_BACKEND, ROLLOUT_BACKENDS, backends_with, rollout_backend,
                                rollout_backend_names)
from .loss_params import check_loss_params
from ..state.path_limits import PathTooLong, check_path_length
from .path_form import path_form_problem
from .server_url import distinct_servers, server_url
from .value_kinds import value_kinds

# ----------------------------------------------------------------------------------------------- value types

# Every count has a ceiling: what a C int holds, the narrowest integer the libraries a setting reaches take
# (torch.set_num_threads, a tokenizer's max_length). Past it a value failed deep inside them ("Overflow when unpacking
# long", an OverflowError traceback from the tokenizer) instead of here, naming the key. A count with a narrower
# meaning declares its own bound; tests/engine/config/test_config_ceilings.py holds every integer key to one.
MAX_COUNT = 2**31 - 1
PositiveInt = Annotated[int, Field(ge=1, le=MAX_COUNT)]
NonNegativeInt = Annotated[int, Field(ge=0, le=MAX_COUNT)]
PositiveFloat = Annotated[float, Field(gt=0)]
MAX_DISTRIBUTED_TIMEOUT_S = 7 * 24 * 3600.0  # a week: past any step; torch holds the timeout in milliseconds
NonNegativeFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]  # (0, 1]

# A Hub repository id: ORG/NAME of letters, digits, '-', '_', '.' (no '--' or '..', as the Hub's rule); anything
# else that is not a local path is a typo, said at once rather than as a failed download.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")


def is_hub_id(name: str) -> bool:
    return bool(_HUB_ID.match(name)) and "--" not in name and ".." not in name and not name.endswith((".", "-"))


def expand_user(name: str) -> str:
    """`name` with a leading ~ or ~user expanded (the shell's meaning); as written where that user has no home
    (then it names no file, and the key's own check refuses it)."""
    return os.path.expanduser(name)


def user_path(name: str) -> Path:
    return Path(expand_user(name))


class PathSetting:
    """Marks a setting that names a file or directory: its value is stored with ~ expanded, so that every path
    setting means the same by `~` (the shell's home), whoever reads it (a run directory, a data file, a model)."""


PATH = PathSetting()


def broken_link(path: Path) -> Optional[str]:
    """Why `path` (or a directory on it) is a link that leads nowhere, or None. Such a path names a local file
    that is gone: read as a Hub id ORG/NAME, it would download another repository of that name."""
    for part in (path, *path.parents):
        if part.is_symlink() and not part.exists():
            loop = False
            try:
                part.resolve(strict=True)
            except (RuntimeError, OSError) as exc:  # a loop: RuntimeError before Python 3.13, OSError ELOOP since
                loop = isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == errno.ELOOP
            return (f"{str(part)!r} is a link to {os.readlink(part)!r}, which "
                    f"{'leads back to itself' if loop else 'does not exist'}")
    return None


def _local_through_a_link(name: str) -> None:
    try:  # asking the filesystem about such a path fails with ENAMETOOLONG and the whole path
        check_path_length(expand_user(name), "")
    except PathTooLong as exc:
        raise ValueError(exc.reason) from None
    link = broken_link(user_path(name))
    if link:
        raise ValueError(f"a local path, and {link}: fix the link or name the file itself (not read as a Hub id)")


def _path_form(name: str) -> str:
    problem = path_form_problem(name)  # a name no file system takes, refused before any look for it
    if problem:
        raise ValueError(problem)
    return name


def _model_location(name: str) -> str:
    _local_through_a_link(name)
    if not user_path(name).is_dir() and not is_hub_id(name):
        raise ValueError("expected a local model directory or a Hub id ORG/NAME")
    return name


# The suffixes of data files (and of the archives they come in): a Hub repository's name does not end in one.
DATA_FILE_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet", ".csv", ".tsv", ".txt", ".arrow", ".gz", ".bz2", ".xz",
                      ".zst", ".zip", ".tar")


def local_data_path(name: str) -> Optional[str]:
    """Why `name`, shaped like ORG/NAME, is a local path all the same, or None: it ends in a data file's suffix.
    `data/trian.jsonl` (a typo) was read as a Hub id, and the run failed on the network or the Hub cache, never
    saying the file was not there. (A name under a local directory may still be an id: `org/` can be anything.)"""
    suffix = next((s for s in DATA_FILE_SUFFIXES if name.lower().endswith(s)), None)
    return None if suffix is None else f"a name ending in {suffix} is a file's, not a Hub dataset id's"


def _data_location(name: str) -> str:
    _local_through_a_link(name)
    if not user_path(name).exists():
        local = local_data_path(name) if is_hub_id(name) else None
        if local is not None:
            raise ValueError(f"expected an existing file or directory, and there is none by that name ({local})")
        if not is_hub_id(name):
            raise ValueError("expected an existing file or directory, or a Hub dataset id ORG/NAME")
    return name


FilePath = Annotated[str, AfterValidator(_path_form), AfterValidator(expand_user), PATH]
ModelLocation = Annotated[str, AfterValidator(_path_form), AfterValidator(_model_location), AfterValidator(expand_user),
                          PATH]
DataLocation = Annotated[str, AfterValidator(_path_form), AfterValidator(_data_location), AfterValidator(expand_user),
                         PATH]


def _one_as_list(value: Any) -> Any:
    """A list setting given one value (`--rollout.server.urls http://host:8000`) takes it as a list of one."""
    return [value] if isinstance(value, (str, int, float)) else value


def ListOf(item: Any, min_length: int = 0) -> Any:
    """A list setting: a list of `item`s, or one item alone as a list of one."""
    return Annotated[list[item], Field(min_length=min_length), BeforeValidator(_one_as_list)]


def _module_names(value: Any) -> Any:
    """model.lora.target_modules: all-linear, or module names (one name alone is a list of one)."""
    return [value] if isinstance(value, str) and value != ALL_LINEAR else value


ALL_LINEAR = "all-linear"


def _is_hub_read(name: Optional[str]) -> bool:
    """Whether a model / data setting names a Hub repository (rather than a local path)."""
    return name is not None and not user_path(name).exists() and is_hub_id(name)


# What datasets.save_to_disk writes at the top of a DatasetDict directory: a local dataset with splits.
DATASET_DICT_FILE = "dataset_dict.json"


def has_splits(name: Optional[str]) -> bool:
    """Whether a data setting names a dataset with splits: a Hub dataset, or a local DatasetDict directory."""
    return _is_hub_read(name) or (name is not None and (user_path(name) / DATASET_DICT_FILE).is_file())


def read_when_split(key: str) -> ReadWhen:
    """Read when the data location setting `key` names a dataset with splits (has_splits)."""
    return ReadWhen(f"{key} a Hub id or a DatasetDict directory (datasets.save_to_disk)",
                    lambda c: has_splits(value_at(c, key)), {key: "org/name"}, {key: None})


def read_when_hub(*keys: str) -> ReadWhen:
    """Read when one of the location settings `keys` names a Hub repository."""
    return ReadWhen(f"{' or '.join(keys)} a Hub id", lambda c: any(_is_hub_read(value_at(c, k)) for k in keys),
                    {keys[0]: "org/name"}, {key: None for key in keys})


def read_with_section(section: str) -> ReadWhen:
    """A rollout section's settings are read by the backends whose registry entry declares that section."""
    owners = backends_with(section=section)
    return ReadWhen(f"rollout.backend {' or '.join(owners)}",
                    lambda c: rollout_backend(c.rollout.backend).section == section,
                    {"rollout.backend": owners[0]}, {"rollout.backend": DEFAULT_ROLLOUT_BACKEND})


LORA_ON = read_when_is("model.lora.enabled", True, otherwise=False)
# Evaluation runs on data.eval_path, or on the built-in task's problems (held out, or its training ones).
BUILTIN_TASK = ReadWhen("data.path null (the built-in addition task)", lambda c: c.data.path is None, {},
                        {"data.path": "org/train"})
DATA_FILE = ReadWhen("data.path set", lambda c: c.data.path is not None, {"data.path": "org/train"}, {})
MATH_REWARD = read_when_listed("rewards.functions", "math_accuracy", "length")
WARM_START = read_when_positive("run.warm_start_steps")
MAX_BUILTIN_OPERAND = 999
# NumPy's seed domain (accelerate's set_seed seeds NumPy, Python's and torch's RNGs with the run's seed)
MAX_SEED = 2**32 - 1
EVALUATION_DATA = read_when_any(
    "data.eval_path set (or data.path null: the built-in task)",
    ReadWhen("data.eval_path set", lambda c: c.data.eval_path is not None, {"data.eval_path": "org/eval"},
             {"data.eval_path": None}),
    ReadWhen("data.path null", lambda c: c.data.path is None, {}, {"data.path": "org/train"}))

# With one optimisation pass over each batch (optim.num_iterations 1) the old log-probs are the current ones: the
# importance ratio is 1, inside every trust region, and a bound on it (loss.epsilon, epsilon_high, delta) clips
# nothing. A ratio cap (cispo) still scales a ratio of 1 down when it is below 1, so it stays read.
RATIO_MOVES = ReadWhen(
    "optim.num_iterations > 1 (with one pass over each batch the importance ratio is 1, inside any trust region)",
    lambda c: c.optim.num_iterations > 1 or get_loss_type(c.loss.loss_type).clip != TRUST_REGION,
    {"optim.num_iterations": 2}, {"optim.num_iterations": 1, "loss.loss_type": DEFAULT_LOSS_TYPE})



def read_within_the_run(key: str, *, last_step_does_it: bool) -> ReadWhen:
    """A step interval (every `key` steps) is read when one of its steps falls within run.max_steps: past it the run
    never reaches one, and at it, where the run's last step does the same anyway (saves, evaluates), it adds none."""
    reach = "below" if last_step_does_it else "at most"
    return ReadWhen(f"{key} {reach} run.max_steps", lambda c: value_at(c, key) < c.run.max_steps + (
        0 if last_step_does_it else 1), {"run.max_steps": 100}, {"run.max_steps": 1})


# int(warmup_ratio x optimizer steps) warms up: a ratio of fewer steps than one is no warmup at all.
WARMS_UP = ReadWhen("optim.warmup_ratio x run.max_steps x optim.num_iterations >= 1 (the warmup's optimizer steps, "
                    "rounded down)", lambda c: c.warmup_steps() >= 1, {"run.max_steps": 100},
                    {"run.max_steps": 1, "optim.num_iterations": 1})

# The kernels' backends: the registry's names, read when a config is checked (grpo_kernels.backends imports no
# torch), so a backend registered later is a valid run.loss_backend. "auto" routes each call by the cost model.
# The rollout backends: grpo_engine/rollout/registry.py's entries (a backend registered later is a valid choice).
# The off-policy correction's modes (TRL's vLLM importance-sampling names, and auto / off).
ImportanceSampling = Literal["auto", "off", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
BUILTIN_REWARDS = ("math_accuracy", "format", "length")

# A key that is not in the schema because another key holds the setting: the message for the user who sets it.
SHARED_SETTINGS = {
    "loss.temperature": "the loss scores the completions at the temperature they were sampled at: set "
                        "rollout.temperature",
    "loss.max_completion_length": "the loss types with a fixed normaliser divide by the longest possible "
                                  "completion: set rollout.max_new_tokens",
}


# Marks a text setting taken as written, empty included (a system prompt may be ''); every other text setting
# refuses a blank value (Section._no_blank_text).
FREE_TEXT = {"free_text": True}


class Section(BaseModel):
    """Strict: no key outside the schema, no value of another type (an int is taken for a float), no NaN or
    infinity; assignments are validated too."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, validate_assignment=True)

    def __setattr__(self, name: str, value: Any) -> None:
        # A key set after load (`config.run.max_steps = -3` in a notebook) is refused in the line a load gives,
        # naming the dotted key: pydantic's own error was five lines with a link, and a mistyped key a ValueError
        # naming the class. A Path, a numpy scalar or a tuple is taken as the flags' value (plain_values.py).
        if name.startswith("_"):
            return super().__setattr__(name, value)
        at = section_path(type(self))
        if name not in type(self).model_fields:
            raise ConfigError(unknown_key_message(EngineConfig, (*at, name), SHARED_SETTINGS))
        try:
            super().__setattr__(name, plain_value(value))
        except ValidationError as exc:
            raise ConfigError(describe(exc, EngineConfig, SHARED_SETTINGS, at)) from None

    @field_validator("*", mode="before")
    @classmethod
    def _no_blank_text(cls, value: Any, info: ValidationInfo) -> Any:
        # Every text setting of every section but free text (FREE_TEXT): an empty or blank string names nothing.
        # As a path it would be the working directory (Path('') is '.': a run writing into it, a model or data read
        # from it), as a name or a column nothing at all. A key that may be null is unset with null.
        # Every text setting, free text too: Unicode (a lone UTF-16 surrogate, from a flag of bytes that are not
        # UTF-8 or a YAML escape, is text no file or tokenizer can encode).
        texts = value if isinstance(value, list) else (value,)
        if any(isinstance(text, str) and _lone_surrogate(text) for text in texts):
            raise ValueError("expected Unicode text (it holds a lone UTF-16 surrogate, which no file or tokenizer "
                             "can encode)")
        field = cls.model_fields[info.field_name]
        if (field.json_schema_extra or {}).get("free_text") or not {str, list} & value_kinds(field.annotation):
            return value  # free text, or no text at all: blank text for a number is "expected an integer, got ''"
        if any(isinstance(text, str) and not text.strip() for text in texts):
            raise ValueError("expected a non-empty text (null unsets a key that may be null)")
        return value


    @field_validator("*", mode="after")
    @classmethod
    def _within_float32(cls, value: Any) -> Any:
        # Every number the engine reads as a float ends in float32 (the weights, the optimizer's step, the
        # sampler's logits, the advantages): past its range optim.learning_rate 3.5e38 failed inside AdamW ("value
        # cannot be converted to type float without overflow", 34 lines) and a weight decay of 3.5e38 saved a
        # checkpoint of NaN weights. Ints of count settings are bounded by their own ceilings.
        numbers = value if isinstance(value, list) else (value,)
        if any(type(number) is float and abs(number) > FLOAT32_MAX for number in numbers):
            raise ValueError(f"expected a number within float32's range (at most {FLOAT32_MAX:.7g} in magnitude)")
        return value


def _lone_surrogate(text: str) -> bool:
    return any("\ud800" <= char <= "\udfff" for char in text)


def _choice(allowed: Union[tuple[str, ...], Callable[[], tuple[str, ...]]]) -> AfterValidator:
    """A string out of a set: a fixed tuple, or a registry's names read when a value is checked (so that a backend
    registered after import is a valid choice): one place to read them from."""
    def check(value: str) -> str:
        names = allowed() if callable(allowed) else allowed
        if value not in names:
            raise ValueError(f"expected one of {', '.join(names)}")
        return value

    return AfterValidator(check)


# ----------------------------------------------------------------------------------------------- sections

class LoraConfig(Section):
    enabled: bool = Field(False, description="train LoRA adapters (peft) instead of every weight")
    r: Annotated[PositiveInt, LORA_ON] = Field(16, description="adapter rank")
    alpha: Annotated[PositiveInt, LORA_ON] = Field(
        32, description="adapter scale numerator (the update is scaled by alpha / r)")
    dropout: Annotated[float, Field(ge=0, lt=1), LORA_ON] = Field(0.05, description="dropout on the adapters' input")
    target_modules: Annotated[Union[str, Annotated[list[str], Field(min_length=1)]], BeforeValidator(_module_names),
                              LORA_ON] = Field(
        ALL_LINEAR, description="module names to adapt (one name alone is a list of one), or all-linear")


class ModelConfig(Section):
    name_or_path: Optional[ModelLocation] = Field(
        None, description="a local Hugging Face causal-LM directory or a Hub id ORG/NAME (downloaded once into the "
                          "Hugging Face cache; HF_HUB_OFFLINE=1 reads the cache only); null builds the tiny built-in "
                          "demo model in code")
    revision: Annotated[Optional[str], read_when_hub("model.name_or_path")] = Field(
        None, description="a Hub id's branch, tag or commit (null: main)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: bf16 on CUDA, fp32 on CPU")
    attn_implementation: Literal["auto", "eager", "sdpa", "flash_attention_2"] = Field(
        "auto", description="auto: flash_attention_2 on CUDA when flash-attn is installed, else sdpa")
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in the backward: less memory, more time")
    lora: LoraConfig = Field(default_factory=LoraConfig)
    tensor_parallel: PositiveInt = Field(
        1, description=">1: shard the model over that many processes with transformers' tensor-parallel plan (pure "
                       "TP: it must equal the number of processes; every process then generates and trains on the "
                       "whole batch)")
    fsdp: bool = Field(
        False, description="fully sharded data parallelism (FSDP2): each of the processes holds 1/N of the weights, "
                           "gradients and AdamW state (full fine-tuning; launch 2 or more processes with torchrun)")

    @model_validator(mode="after")
    def _one_way_to_split_the_model(self) -> "ModelConfig":
        if self.tensor_parallel > 1 and self.lora.enabled:
            raise ValueError("model.tensor_parallel > 1 does not support model.lora.enabled: train LoRA adapters "
                             "with data parallelism (model.tensor_parallel 1)")
        if self.fsdp and self.lora.enabled:
            raise ValueError("model.fsdp does not support model.lora.enabled: LoRA's few trainable weights need no "
                             "sharding; train LoRA adapters with data parallelism (model.fsdp false)")
        if self.fsdp and self.tensor_parallel > 1:
            raise ValueError("model.fsdp cannot be combined with model.tensor_parallel > 1: use one of them")
        return self


class DataConfig(Section):
    path: Optional[DataLocation] = Field(
        None, description="JSONL / Parquet file, a datasets.save_to_disk directory or a Hub dataset id ORG/NAME (read "
                          "with datasets.load_dataset); null uses the built-in addition task. A relative path in a "
                          "YAML file is read next to that file")
    eval_path: Optional[DataLocation] = Field(
        None, description="prompts for evaluation before / after / every run.eval_steps (same forms)")
    config: Annotated[Optional[str], read_when_hub("data.path", "data.eval_path")] = Field(
        None, description="a Hub dataset's configuration (GSM8K: main); null: its only or default one")
    split: Annotated[str, read_when_split("data.path")] = Field(
        "train", description="the split of a Hub dataset path (or a DatasetDict directory) to train on")
    eval_split: Annotated[str, read_when_split("data.eval_path")] = Field(
        "test", description="the split of a Hub dataset eval_path (or a DatasetDict directory) to evaluate on")
    prompt_column: str = Field("prompt", description="the column holding the prompt text or chat messages")
    system_prompt: Optional[str] = Field(
        None, json_schema_extra=FREE_TEXT, description="when set, a plain-text prompt becomes [system, user] chat messages and the chat template "
                          "is applied")
    max_prompt_length: Optional[PositiveInt] = Field(
        512, description="longer prompts keep their last tokens (TRL default 512)")
    max_prompt_chars: Annotated[Optional[PositiveInt], DATA_FILE] = Field(
        100_000, description="prompts longer than this many characters are refused when the data loads (null: no "
                             "bound): a tokenizer reads every character before it truncates, so one runaway line of "
                             "megabytes would stall the run")
    shuffle: bool = Field(True, description="a fresh seeded permutation of the prompts each epoch")
    # Every (a, b) pair is built in memory and its prompt tokenized before the run starts: 10^4 meant 10^8 rows,
    # and the process was killed for memory with no word.
    builtin_max_operand: Annotated[int, Field(ge=1, le=MAX_BUILTIN_OPERAND), BUILTIN_TASK] = Field(
        9, description=f"the built-in addition task (used when path is null): operands 0..builtin_max_operand (at "
                       f"most {MAX_BUILTIN_OPERAND}: its (n + 1)^2 problems are built in memory)")
    builtin_eval_size: Annotated[NonNegativeInt, BUILTIN_TASK] = Field(
        0, description="built-in task: problems held out for evaluation (0: evaluate on the training ones); fewer "
                       "than its (builtin_max_operand + 1)^2 problems")

    @model_validator(mode="after")
    def _held_out_problems_leave_some_to_train_on(self) -> "DataConfig":
        problems = (self.builtin_max_operand + 1) ** 2
        if self.builtin_eval_size >= problems:
            raise ValueError(f"data.builtin_eval_size ({self.builtin_eval_size}) must be below the {problems} "
                             f"problems of data.builtin_max_operand={self.builtin_max_operand}")
        return self


class VLLMConfig(Section):
    gpu_memory_utilization: Fraction = Field(
        0.3, description="CUDA: the fraction of the GPU's memory vLLM takes for its weights and KV cache (TRL's "
                         "colocate default)")
    sleep: bool = Field(
        False, description="CUDA: vLLM's sleep mode: its weights and KV cache leave the GPU while the trainer computes")
    tensor_parallel_size: PositiveInt = Field(
        1, description="CUDA: vLLM shards the model over this many processes: 1 (a whole copy per process), or "
                       "model.tensor_parallel")
    kv_cache_mb: Optional[PositiveInt] = Field(
        None, description="the KV cache's size in MiB (null: on CUDA from gpu_memory_utilization, on a CPU 512)")
    max_model_len: Optional[PositiveInt] = Field(
        None, description="the longest prompt + completion vLLM plans for (null: data.max_prompt_length + "
                          "rollout.max_new_tokens); at least that sum")


class ServerConfig(Section):
    urls: Annotated[ListOf(Annotated[str, AfterValidator(server_url)], min_length=1),
                    AfterValidator(distinct_servers)] = Field(
        default_factory=lambda: ["http://127.0.0.1:8000"],
        description="vllm_server: the base URLs of the vLLM servers (vLLM's OpenAI-compatible server, e.g. from "
                    "grpo-engine serve); training process i generates on the (i mod len(urls))-th, the weights go "
                    "to all")
    model: Optional[str] = Field(None, description="the served model name (null: the first one the server lists)")
    timeout_s: PositiveFloat = Field(
        300.0, description="how long a server that stops answering is retried, with backoff, before the run stops "
                           "with a checkpoint saved")
    request_timeout_s: PositiveFloat = Field(600.0, description="the longest one HTTP request may take")
    max_concurrent_requests: PositiveInt = Field(
        64, description="completion requests in flight to one server (one request per completion, each with its "
                        "own seed)")
    weight_transfer: Literal["auto", "nccl", "reload"] = Field(
        "auto", description="how the trained weights reach the servers after every optimizer step: nccl (CUDA: "
                            "vLLM's weight-transfer API, broadcast from training process 0), reload (vLLM's "
                            "reload_weights from safetensors written to weights_dir; the server needs "
                            "VLLM_SERVER_DEV_MODE=1); auto: nccl on CUDA, else reload")
    lora_transfer: Literal["auto", "adapter", "merged"] = Field(
        "auto", description="with model.lora.enabled, how the trained LoRA reaches the servers: adapter (the servers "
                            "keep their base weights; after every optimizer step the adapter is written to "
                            "weights_dir and loaded through vLLM's /v1/load_lora_adapter under a new name, which "
                            "the completion requests then name; the server needs grpo-engine serve --lora-rank R: "
                            "--enable-lora, --max-lora-rank >= model.lora.r, VLLM_ALLOW_RUNTIME_LORA_UPDATING), "
                            "merged (the adapter merged into the whole weights, sent by weight_transfer); auto: "
                            "adapter when LoRA is on")
    weights_dir: Optional[FilePath] = Field(
        None, description="reload and adapter: the directory the weights or adapters are written to, which every "
                          "server must read (a shared filesystem past one machine; null: "
                          "run.output_dir/server_weights)")
    nccl_host: Optional[str] = Field(
        None, description="nccl: the address of training process 0 the servers connect to (null: this host's name)")
    nccl_port: Annotated[int, Field(ge=1024, le=65535)] = Field(
        29700, description="nccl: the port of the weight-transfer group's rendezvous")


class RolloutConfig(Section):
    backend: Annotated[str, _choice(rollout_backend_names)] = Field(
        DEFAULT_ROLLOUT_BACKEND, description="; ".join(f"{name}: {spec.summary}"
                                                       for name, spec in ROLLOUT_BACKENDS.items()))
    num_generations: Annotated[int, Field(ge=2, le=MAX_COUNT)] = Field(
        8, description="completions per prompt (G): advantages compare each with its group, so at least 2")
    max_new_tokens: PositiveInt = Field(
        256, description="the longest completion; also the fixed normaliser of the loss types that divide by it "
                         "(dr_grpo)")
    temperature: Annotated[float, Field(ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE)] = Field(
        1.0, description="sampling temperature; the loss's log-probs are computed at the same one (at least "
                         "1e-30: float32 logits divided by less overflow; at most 1e30: divided by more they round "
                         "to 0, uniform samples and no gradient)")
    top_p: Fraction = Field(1.0, description="nucleus sampling (1: off)")
    top_k: NonNegativeInt = Field(0, description="top-k sampling (0: off)")
    # At least the smallest temperature, for the temperature's reason: generate divides the logits by it, and a
    # subnormal penalty (1e-320) made them infinite, a traceback from torch.multinomial at the first step. At most
    # the largest temperature, for its reason: a repeated token's logit divided by more is 0, whatever it was.
    repetition_penalty: Annotated[float, Field(ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE)] = Field(
        1.0, description="transformers' repetition penalty in generate (1: off)")
    replay_kept_tokens: Annotated[bool, ReadWhen(
        "rollout.top_p < 1 or rollout.top_k > 0", lambda c: c.rollout.top_p < 1 or c.rollout.top_k > 0,
        {"rollout.top_k": 5}, {"rollout.top_p": 1.0, "rollout.top_k": 0})] = Field(
        True, description="with top_p < 1 or top_k > 0: score the policy and old/reference log-probs over the ids "
                          "the sampler kept at each position, as it drew them (false: over the whole vocabulary; "
                          "without truncation nothing to replay)")
    mask_truncated_completions: bool = Field(
        False, description="TRL's option: completions that hit max_new_tokens without EOS get an all-zero loss mask")
    sample_padded_vocab: bool = Field(
        False, description="sample (and score) the vocabulary rows past the tokenizer's last token, which a model "
                           "padded its vocabulary with (Qwen2.5) and which decode to nothing (false: never sampled, "
                           "left out of the log-probs)")
    vllm: Annotated[VLLMConfig, read_with_section("vllm")] = Field(default_factory=VLLMConfig)
    server: Annotated[ServerConfig, read_with_section("server")] = Field(default_factory=ServerConfig)
    max_staleness: NonNegativeInt = Field(
        0, description="vllm_server: 0 generates each batch from the policy it trains (on-policy); k >= 1 generates "
                       "the next batches while this one trains, from a policy up to k optimizer steps older; older "
                       "samples are dropped (and counted)")
    importance_sampling: ImportanceSampling = Field(
        "auto", description="the off-policy correction: each token's loss times the ratio of the trainer's "
                            "probability (before the update) to the sampler's, capped (truncate) or zeroed past "
                            "the cap (mask), per token or per sequence (the product); auto: token_truncate with "
                            "max_staleness >= 1, else off")
    importance_sampling_cap: Annotated[float, Field(gt=1), ReadWhen(
        "an off-policy correction in force (rollout.importance_sampling, or max_staleness >= 1)",
        lambda c: c.rollout.importance_sampling_mode() is not None, {"rollout.importance_sampling": "token_mask"},
        {"rollout.importance_sampling": "off"})] = Field(
        3.0, description="the cap of the importance-sampling ratio (> 1)")

    def importance_sampling_mode(self) -> Optional[str]:
        """The off-policy correction in force, or None."""
        if self.importance_sampling == "auto":
            return "token_truncate" if self.max_staleness > 0 else None
        return None if self.importance_sampling == "off" else self.importance_sampling

    def replays_kept_tokens(self) -> bool:
        """Whether rollouts record, and the log-probs replay, the sampler's kept-token sets."""
        truncating = self.top_p < 1.0 or self.top_k > 0
        return truncating and self.replay_kept_tokens


# `package.module:function`: the module a dotted name of identifiers, as `import` takes it (`a..b:f` and `mod.:f`
# passed the former pattern and failed in importlib's words).
_REWARD_SPEC = re.compile(r"[^\W\d]\w*(?:\.[^\W\d]\w*)*:[^\W\d]\w*")


def _reward_spec(spec: str) -> str:
    module, colon, function = spec.rpartition(":")
    if colon and (module.endswith(".py") or any(mark in module for mark in "/\\")):
        # A file named where a module goes: `rewards.py:score` ran rewards.py on import as the module `rewards`, then
        # failed naming the engine's own file ("No module named 'rewards.py'; 'rewards' is not a package")
        name = module.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py") or "module"
        raise ValueError(f"expected 'module:function', not a file: write '{name}:{function}' (the module is looked up "
                         f"in the working directory and on sys.path; PYTHONPATH adds the file's directory)")
    if spec not in BUILTIN_REWARDS and not _REWARD_SPEC.fullmatch(spec):
        raise ValueError(f"expected a built-in reward ({', '.join(BUILTIN_REWARDS)}) or 'package.module:function'")
    return spec


class RewardsConfig(Section):
    functions: ListOf(Annotated[str, AfterValidator(_reward_spec)], min_length=1) = Field(
        default_factory=lambda: ["math_accuracy"],
        description="built-in names (math_accuracy, format, length) or package.module:function")
    weights: Optional[ListOf(float)] = Field(None, description="one per function; all 1.0 when null")
    answer_column: Annotated[str, MATH_REWARD] = Field(
        "answer", description="the dataset column math_accuracy compares against")
    math_correct: Annotated[float, MATH_REWARD] = Field(1.0, description="math_accuracy: reward of a correct answer")
    math_wrong: Annotated[float, MATH_REWARD] = Field(-1.0, description="math_accuracy: reward of a wrong answer")
    math_no_answer: Annotated[float, MATH_REWARD] = Field(
        -0.5, description="math_accuracy: reward when no \\boxed{} answer is found")
    length_cache: Annotated[NonNegativeInt, read_when_listed("rewards.functions", "length", "math_accuracy")] = Field(
        32, description="length: DAPO's soft overlong punishment, 0 up to rollout.max_new_tokens - length_cache, "
                        "linear down to -1 (at most rollout.max_new_tokens)")
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="divide advantages by the group / batch std")
    # At most the longest wait threading's timer takes (threading.TIMEOUT_MAX, about 292 years): past it the timer
    # thread died with an OverflowError traceback and the limit silently did not apply.
    timeout_seconds: Optional[Annotated[float, Field(gt=0, le=threading.TIMEOUT_MAX)]] = Field(
        600.0, description="seconds one call of a reward function (one batch), or the import of its module, may take "
                           "before the run stops naming it (null: no limit)")

    @model_validator(mode="after")
    def _one_weight_per_function(self) -> "RewardsConfig":
        if self.weights is not None and len(self.weights) != len(self.functions):
            raise ValueError(f"rewards.weights has {len(self.weights)} entries for {len(self.functions)} "
                             f"rewards.functions")
        if self.weights is not None and not any(self.weights):
            # every reward times 0 (-0.0 included): every advantage is 0 and no step changes the model
            raise ValueError(f"rewards.weights are all 0 ({self.weights}): no completion would be preferred to "
                             f"another; give at least one function a non-zero weight")
        return self


def _loss_type(name: str) -> str:
    if name not in loss_type_names():
        raise ValueError(f"expected one of {', '.join(loss_type_names())} (grpo_kernels.register_loss_type adds one)")
    return name


class LossSection(Section):
    """The base of the `loss` section: the declared hyper-parameters of the loss type, checked and filled in."""

    @model_validator(mode="before")
    @classmethod
    def _trl_names_of_saved_configs(cls, data: Any) -> Any:
        # A config.yaml saved before sapo's and vespo's hyper-parameters became loss.params holds them by TRL's
        # names (every key, at its default where unread): read back, each goes to loss.params when it belongs to
        # the chosen loss type and is dropped at its default otherwise (it was not read); a value set for another
        # type is refused, naming the key and where the setting lives now.
        if not isinstance(data, dict) or not any(key in loss_param_aliases() for key in data):
            return data
        data, params = dict(data), dict(data.get("params") or {})
        chosen = data.get("loss_type", cls.model_fields["loss_type"].default)
        for alias, (owner, param) in loss_param_aliases().items():
            if alias not in data:
                continue
            value = data.pop(alias)
            if owner == chosen:
                params.setdefault(param, value)
            elif value != get_loss_type(owner).params[param].default:
                raise ValueError(f"loss.{alias} ({value!r}) is read only with loss.loss_type {owner}, where it is "
                                 f"loss.params.{param}")
        if params or "params" in data:
            data["params"] = params
        return data

    @model_validator(mode="after")
    def _declared_params(self) -> "LossSection":
        filled = check_loss_params(self.loss_type, self.params)
        if filled != self.params:
            object.__setattr__(self, "params", filled)  # no re-validation loop through validate_assignment
        return self


def _setting_type(name: str, annotation: Any, declaration: LossSetting) -> Any:
    """The pydantic type of a declared loss setting: its field's type, with its bounds and read condition."""
    args = typing.get_args(annotation)
    nullable = type(None) in args and typing.get_origin(annotation) is not Literal
    base = next(arg for arg in args if arg is not type(None)) if nullable else annotation
    # a float within float32's range, as GRPOLossConfig checks it (LossSetting.float_bounds)
    bounds = declaration.float_bounds() if base is float else {
        key: getattr(declaration, key) for key in ("ge", "gt", "le") if getattr(declaration, key) is not None}
    if name == "loss_type":
        base = Annotated[str, AfterValidator(_loss_type)]
    elif bounds:
        base = Annotated[base, Field(**bounds)]
    typed = Optional[base] if nullable else base
    condition = declaration.read_when
    conditions = [] if condition is None else [
        ReadWhen(f"loss.{condition.text}", lambda c: condition.holds(c.loss),
                 {f"loss.{k}": v for k, v in condition.when_true.items()},
                 {f"loss.{k}": v for k, v in condition.when_false.items()})]
    if declaration.bounds_the_ratio:
        conditions.append(RATIO_MOVES)
    return Annotated[(typed, *conditions)] if conditions else typed


def loss_section(config_class: type = GRPOLossConfig) -> type[LossSection]:
    """The engine's `loss` section, derived from the kernels' declarations (grpo_kernels/config.py: each setting's
    type, bounds, default and meaning), less the settings the rollout owns (SHARED_SETTINGS), plus `params`."""
    hints = typing.get_type_hints(config_class)
    declared = {
        f.name: (_setting_type(f.name, hints[f.name], f.metadata["setting"]),
                 Field(f.default, description=f.metadata["setting"].help))
        for f in dataclasses.fields(config_class)
        if "setting" in f.metadata and f"loss.{f.name}" not in SHARED_SETTINGS}
    params = (dict[str, Any], Field(default_factory=dict, description=(
        "a loss type's own hyper-parameters by name (sapo: temperature_pos, temperature_neg; vespo: k_pos, "
        "lambda_pos, k_neg, lambda_neg; a registered type's as it declares them); unset ones take the declared "
        "defaults")))
    return create_model("LossConfig", __base__=LossSection, __module__=__name__, **declared, params=params)


LossConfig = loss_section()


class OptimConfig(Section):
    learning_rate: NonNegativeFloat = Field(1e-6, description="AdamW's peak learning rate")
    weight_decay: NonNegativeFloat = Field(0.0, description="AdamW's decoupled weight decay")
    adam_beta1: Annotated[float, Field(ge=0, lt=1)] = Field(0.9, description="AdamW's first-moment decay")
    adam_beta2: Annotated[float, Field(ge=0, lt=1)] = Field(0.999, description="AdamW's second-moment decay")
    adam_epsilon: PositiveFloat = Field(1e-8, description="AdamW's denominator epsilon")
    max_grad_norm: NonNegativeFloat = Field(1.0, description="gradient-norm clipping (0: off)")
    master_weights: Literal["auto", "float32", "none"] = Field(
        "auto", description="auto: AdamW steps float32 copies of 16-bit trained weights (model.dtype bfloat16 / "
                            "float16, full fine-tuning) and rounds them into the model after each step, its moments "
                            "float32 too (8 more bytes a weight); float32: for every trained weight; none: AdamW "
                            "steps 16-bit weights in their dtype, where a step below half their spacing is lost")
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = Field(
        "linear", description="the LR's shape after warmup")
    warmup_ratio: Annotated[float, Field(ge=0, lt=1), WARMS_UP] = Field(
        0.0, description="fraction of the optimizer steps spent warming the LR up linearly")
    per_device_train_batch_size: PositiveInt = Field(8, description="completions per micro-batch of the padded step")
    gradient_accumulation_steps: PositiveInt = Field(1, description="micro-batches per optimizer step")
    num_iterations: PositiveInt = Field(
        1, description="optimizer passes over each generated batch (mu in the GRPO paper)")
    padding_free: bool = Field(
        True, description="train on packs of whole sequences (prompt + completion, no padding) instead of padded "
                          "micro-batches of per_device_train_batch_size completions; the old and reference "
                          "log-probs are packed the same way")
    max_tokens_per_micro_batch: Annotated[Optional[PositiveInt], read_when_is(
        "optim.padding_free", True, otherwise=False)] = Field(
        None, description="the tokens of one pack (padding_free); at least data.max_prompt_length + "
                          "rollout.max_new_tokens. null: the batch's longest sequence times "
                          "per_device_train_batch_size with flash_attention_2 or sdpa (run per sequence): no more "
                          "tokens than a padded micro-batch, each batch packed or padded by estimated cost; times 2 "
                          "with eager (its packed mask is dense: attention costs grow with the square of the pack)")

    @model_validator(mode="after")
    def _decay_shrinks_weights(self) -> "OptimConfig":
        # AdamW multiplies every weight by 1 - learning_rate x weight_decay each step: past 1 the decay flips the
        # weights' signs, past 2 it grows them every step until they overflow (a NaN checkpoint, or a traceback from
        # the sampler at the next step).
        if self.learning_rate * self.weight_decay > 1:
            raise ValueError(f"optim.learning_rate x optim.weight_decay must be at most 1 (AdamW multiplies every "
                             f"weight by 1 - their product each step), got {self.learning_rate!r} x "
                             f"{self.weight_decay!r}")
        return self


# The weight decay of the demo's supervised warm start (torch's AdamW default, written out: data/warm_start.py uses
# this one), which bounds run.warm_start_learning_rate as optim.weight_decay bounds optim.learning_rate.
WARM_START_WEIGHT_DECAY = 0.01


class RunConfig(Section):
    output_dir: FilePath = Field(
        "runs/grpo", description="run directory: metrics.jsonl, samples.jsonl, config.yaml, checkpoints/")
    max_steps: PositiveInt = Field(
        100, description="generation rounds; each makes num_iterations optimizer steps. A finished run trains on to "
                         "a larger max_steps with --resume")
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = Field(
        42, description="seeds model init, prompt order and sampling (0 to 2^32 - 1: NumPy's seed domain, which "
                        "every process's RNGs are seeded in)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when available")
    num_threads: Optional[PositiveInt] = Field(
        None, description="CPU threads for torch (null: torch's default), at most the CPUs the process may run on "
                          "(checked when the run starts). Tiny models gain nothing from threads, and on a busy machine "
                          "idle OpenMP threads spin and slow every small op down")
    distributed_timeout_s: Annotated[float, Field(gt=0, le=MAX_DISTRIBUTED_TIMEOUT_S)] = Field(
        1800.0, description="a launched run (WORLD_SIZE > 1): how long a process waits for the others, to join at "
                            "start and in each collective, before the run stops naming MASTER_ADDR:MASTER_PORT "
                            "(torch's default for gloo)")
    loss_backend: Annotated[str, _choice(backend_names)] = Field(
        "auto", description="the kernels' backend for log-probs and loss (auto: routed per call by the cost model; "
                            "see grpo_kernels' README)")
    save_steps: Annotated[NonNegativeInt, read_within_the_run("run.save_steps", last_step_does_it=True)] = Field(
        0, description="checkpoint every this many steps (0: only the final one)")
    save_total_limit: PositiveInt = Field(2, description="keep the last k checkpoints")
    resume: Optional[FilePath] = Field(None, description="latest, or a checkpoint directory")
    save_on_interrupt: bool = Field(
        True, description="Ctrl-C / SIGTERM: finish the step in progress, save a checkpoint and stop with a hint to "
                          "--resume")
    log_completions_steps: Annotated[NonNegativeInt, read_within_the_run(
        "run.log_completions_steps", last_step_does_it=False)] = Field(10, description="log sample completions every this many steps "
                                                                  "(0: never)")
    eval_steps: Annotated[NonNegativeInt, EVALUATION_DATA,
                          read_within_the_run("run.eval_steps", last_step_does_it=True)] = Field(
        0, description="evaluate every this many steps (0: only before and after training, when an eval split "
                       "exists)")
    eval_num_samples: Annotated[PositiveInt, EVALUATION_DATA] = Field(
        1, description="completions per evaluation prompt: 1 is greedy decoding; more are sampled with the rollout "
                       "settings (accuracy is then the mean over samples, and pass@k is reported)")
    report_to: ListOf(Literal["tensorboard", "wandb"]) = Field(
        default_factory=list, description="tensorboard, wandb (metrics.jsonl is always written)")
    progress_bar: bool = Field(True, description="show a tqdm bar with the reward and loss")
    plot: bool = Field(True, description="write curves.png at the end")
    warm_start_steps: NonNegativeInt = Field(
        0, description="supervised steps on the built-in task's reference answers before RL (built-in model only)")
    warm_start_learning_rate: Annotated[NonNegativeFloat, WARM_START] = Field(
        3e-3, description="AdamW LR of the supervised warm start")
    warm_start_target: Annotated[Fraction, WARM_START] = Field(
        1.0, description="the warm start stops early once the mean probability of the reference answers reaches this")

    @model_validator(mode="after")
    def _warm_start_decay_shrinks_weights(self) -> "RunConfig":
        # OptimConfig's rule for the warm start's own AdamW: past 1 the decay flips every weight's sign each step
        if self.warm_start_learning_rate * WARM_START_WEIGHT_DECAY > 1:
            raise ValueError(f"run.warm_start_learning_rate x the warm start's AdamW weight decay "
                             f"({WARM_START_WEIGHT_DECAY}) must be at most 1 (AdamW multiplies every weight by 1 - "
                             f"their product each step), got {self.warm_start_learning_rate!r}: at most "
                             f"{1 / WARM_START_WEIGHT_DECAY:g}")
        return self


class EngineConfig(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    rewards: RewardsConfig = Field(default_factory=RewardsConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    run: RunConfig = Field(default_factory=RunConfig)

    def generation_batch_size(self, num_processes: int = 1) -> int:
        """Completions generated per step over all processes."""
        return self.optim.per_device_train_batch_size * self.optim.gradient_accumulation_steps * num_processes

    def optimizer_steps(self) -> int:
        """The optimizer steps of the whole run: num_iterations per generation round."""
        return self.run.max_steps * self.optim.num_iterations

    def warmup_steps(self) -> int:
        """The optimizer steps of the LR's linear warmup (optim.warmup_ratio of them, rounded down)."""
        return int(self.optim.warmup_ratio * self.optimizer_steps())

    def prompts_per_step(self, num_processes: int = 1) -> int:
        return self.generation_batch_size(num_processes) // self.rollout.num_generations

    def loss_config(self, quiet: bool = True) -> GRPOLossConfig:
        """The kernels' loss config: the loss section, with the settings the rollout owns taken from it. Quiet: the
        kernels' warnings on the combination (TRL's) are said once at the start, in the engine's keys
        (run_setup.loss_warnings); as Python warnings they named `loss_type='bnpo'`, a file and a line of code,
        at every validation of the config."""
        own = {f.name: getattr(self.loss, f.name) for f in dataclasses.fields(GRPOLossConfig)
               if f.name in LossConfig.model_fields}
        with warnings.catch_warnings():
            if quiet:
                warnings.simplefilter("ignore", LossConfigWarning)
            return GRPOLossConfig(**own, temperature=self.rollout.temperature,
                                  max_completion_length=self.rollout.max_new_tokens,
                                  loss_params=dict(self.loss.params))

    def pushes_lora_adapters(self) -> bool:
        """Whether the vllm_server backend sends the servers LoRA adapters rather than whole weights."""
        transfer = self.rollout.server.lora_transfer
        return rollout_backend(self.rollout.backend).lora_adapters and self.model.lora.enabled and \
            transfer != "merged"

    @model_validator(mode="after")
    def _rules_across_sections(self) -> "EngineConfig":
        r, o, v = self.rollout, self.optim, self.rollout.vllm
        longest = None if self.data.max_prompt_length is None else self.data.max_prompt_length + r.max_new_tokens
        if o.padding_free and o.max_tokens_per_micro_batch is not None and longest is not None \
                and longest > o.max_tokens_per_micro_batch:
            raise ValueError(f"optim.max_tokens_per_micro_batch ({o.max_tokens_per_micro_batch}) must hold the "
                             f"longest sequence, data.max_prompt_length + rollout.max_new_tokens = {longest}")
        if v.max_model_len is not None and v.max_model_len < (longest or r.max_new_tokens + 1):
            raise ValueError(f"rollout.vllm.max_model_len ({v.max_model_len}) must hold the longest sequence, "
                             f"data.max_prompt_length + rollout.max_new_tokens = {longest or r.max_new_tokens + 1}")
        backend = rollout_backend(r.backend)
        if r.max_staleness > 0 and not backend.generates_ahead:
            raise ValueError(f"rollout.max_staleness ({r.max_staleness}) needs rollout.backend "
                             f"{' or '.join(backends_with(generates_ahead=True))}: the other backends generate on the "
                             f"training processes, in turn with the update")
        if not backend.kept_token_sets and r.replays_kept_tokens():
            raise ValueError(f"rollout.replay_kept_tokens: rollout.backend {r.backend} does not return the kept-token "
                             f"sets of its sampler: set rollout.replay_kept_tokens false (the trainer then scores the "
                             f"whole vocabulary), drop top_p / top_k, or use rollout.backend "
                             f"{' or '.join(backends_with(kept_token_sets=True))}")
        s = r.server
        if s.lora_transfer == "adapter" and not self.model.lora.enabled:
            raise ValueError("rollout.server.lora_transfer adapter needs model.lora.enabled true (without LoRA the "
                             "whole weights are pushed): set it to auto")
        if self.pushes_lora_adapters() and s.weight_transfer != "auto":
            raise ValueError(f"rollout.server.weight_transfer {s.weight_transfer} sends whole weights, but with "
                             f"model.lora.enabled the servers get adapters (rollout.server.lora_transfer "
                             f"{s.lora_transfer}): set weight_transfer auto, or lora_transfer merged")
        if v.tensor_parallel_size not in (1, self.model.tensor_parallel):
            raise ValueError(f"rollout.vllm.tensor_parallel_size must be 1 or model.tensor_parallel "
                             f"({self.model.tensor_parallel}), got {v.tensor_parallel_size}")
        if "length" in self.rewards.functions and self.rewards.length_cache > r.max_new_tokens:
            raise ValueError(f"rewards.length_cache ({self.rewards.length_cache}) must be at most "
                             f"rollout.max_new_tokens ({r.max_new_tokens}): the length reward starts falling at "
                             f"max_new_tokens - length_cache")
        if self.run.warm_start_steps and self.model.name_or_path is not None:
            raise ValueError("run.warm_start_steps applies to the built-in model only (model.name_or_path is set); "
                             "set it to 0 to train another model")
        try:
            self.loss_config()  # the kernels' own checks of the combination (and TRL's warnings)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"loss: {exc}") from None
        return self


def section_path(section: type[BaseModel]) -> tuple[str, ...]:
    """Where a section's class sits in EngineConfig: () for EngineConfig, ("run",), ("model", "lora")."""
    if not _SECTION_PATHS:
        def walk(model: type[BaseModel], at: tuple[str, ...]) -> None:
            _SECTION_PATHS.setdefault(model, at)
            for name, field in model.model_fields.items():
                if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
                    walk(field.annotation, (*at, name))
        walk(EngineConfig, ())
    return _SECTION_PATHS.get(section, ())


_SECTION_PATHS: dict[type[BaseModel], tuple[str, ...]] = {}


def reads_max_completion_length(loss_type: str) -> bool:
    """Whether the loss type divides by max_completion_length (rollout.max_new_tokens here)."""
    return get_loss_type(loss_type).aggregation.reads_max_completion_length
