"""Loading the policy (and reference) models, and the forward that yields last hidden states, not logits.

The training step never calls the LM head: `HiddenStatePolicy` runs only the decoder stack, and the
kernels apply `lm_head.weight` inside the fused loss. Wrapping the decoder call in one module keeps the
forward inside DDP's wrapper, so `accelerate launch` synchronises gradients as usual.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase,
                          PreTrainedTokenizerFast)
from transformers.distributed import DistributedConfig
from transformers.tokenization_utils_base import VERY_LARGE_INTEGER
from transformers.utils import logging as hf_logging

from grpo_kernels.integrations.lm_head import logit_transform
from grpo_kernels.integrations.sharding import call_with_full_head, is_vocab_parallel_head

from ..config import ConfigError, LoraConfig, ModelConfig
from .causal_attention import check_causal_attention
from .limits import SCORED_VOCAB_ATTR, check_loaded_weights
from .lora_targets import lora_targets_problem
from .model_files import ModelFileError, check_model_files
from .tensor_parallel import is_tensor_parallel
from .tokenizer_files import SpecialTokenError, invented_roles, is_generic, settle_special_tokens


class ModelLoadError(RuntimeError):
    pass


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device is cuda but this machine has no CUDA device torch can use: run.device auto "
                          "or cpu, or a CUDA build of torch on a GPU machine")
    return torch.device(device)


def check_attention(config: ModelConfig, device: torch.device) -> None:
    """What model.attn_implementation needs on this machine, said before anything loads (transformers would
    refuse only when the model is built, after the data, the rewards and a warm start)."""
    if config.attn_implementation != "flash_attention_2":
        return
    if device.type != "cuda":
        raise ConfigError(f"model.attn_implementation flash_attention_2 runs on CUDA GPUs only, and this run is on "
                          f"{device.type}: use sdpa or auto")
    if importlib.util.find_spec("flash_attn") is None:
        raise ConfigError("model.attn_implementation flash_attention_2 needs the flash-attn package, which is not "
                          "installed here: pip install flash-attn, or use sdpa or auto")


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def resolve_attn_implementation(choice: str, device: torch.device) -> str:
    if choice != "auto":
        return choice
    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


# A directory without any of these has no tokenizer: transformers would then build an empty one from
# config.json alone, which fails much later (an IndexError inside `generate`).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")


def check_model_dir(path: str, what: str = "model.name_or_path / --model") -> None:
    """A clear error, naming the directory, for the ways a model directory is commonly incomplete."""
    directory = Path(path)
    if not directory.is_dir():
        raise ModelLoadError(f"model path {path!r} is not a directory ({what})")
    if not any(directory.iterdir()):
        raise ModelLoadError(f"model directory {path!r} is empty ({what})")
    if not (directory / "config.json").is_file() and not (directory / "adapter_config.json").is_file():
        inner = _saved_model_within(directory)
        if inner is not None:
            raise ModelLoadError(f"model directory {path!r} has no config.json: it is {inner[0]}, whose model is "
                                 f"{str(inner[1])!r}; name that ({what})")
        raise ModelLoadError(f"model directory {path!r} has no config.json: not a Hugging Face model directory "
                             f"(save one with model.save_pretrained)")
    if not any((directory / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(f"model directory {path!r} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}): "
                             f"save the tokenizer next to the model with tokenizer.save_pretrained({path!r})")
    try:
        check_model_files(directory)
    except ModelFileError as exc:
        raise ModelLoadError(f"model directory {path!r}: {exc}") from None


def adapter_base(path: str) -> Optional[str]:
    """The base model a directory of LoRA adapters alone (adapter_config.json, no config.json) names, or "" when it
    names none; None for any other directory."""
    directory = Path(path)
    if (directory / "config.json").is_file() or not (directory / "adapter_config.json").is_file():
        return None
    try:
        base = json.loads((directory / "adapter_config.json").read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):  # model_files.py has refused one that cannot be read
        return ""
    return base if isinstance(base, str) else ""


def _saved_model_within(directory: Path) -> Optional[tuple[str, Path]]:
    """(what `directory` is, the model directory it holds) for a checkpoint or a run directory (the newest
    checkpoint's model), which a user names where a model directory goes; None for anything else. Before, both were
    "not a Hugging Face model directory (save one with model.save_pretrained)", advice for another mistake."""
    from ..state.run_files import STATE_FILE, list_checkpoints

    if (directory / STATE_FILE).is_file() and (directory / "model").is_dir():
        return "a checkpoint", directory / "model"
    found = list_checkpoints(directory)
    if found:
        return f"a run directory (its newest checkpoint: {found[-1].name})", found[-1] / "model"
    return None


def _tokenizer_files(path: str, **unset: None) -> PreTrainedTokenizerBase:
    """The tokenizer as its files say: tokenizer.json as it is when they name the generic class (AutoTokenizer would
    take config.json's model type's class instead, which rebuilds the pipeline: tokenizer_files.py)."""
    loader = PreTrainedTokenizerFast if is_generic(Path(path)) else AutoTokenizer
    try:
        return loader.from_pretrained(path, **unset)
    except Exception as exc:  # the tokenizers library's own error types too: one line
        raise ModelLoadError(f"could not load the tokenizer in {path!r}: {type(exc).__name__}: "
                             f"{' '.join(str(exc).split())[:300]}") from None


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    check_model_dir(path)
    tokenizer = _tokenizer_files(path)
    invented = invented_roles(tokenizer, Path(path))
    if invented:  # a class default (Qwen2's <|endoftext|>) the files lack would be a new token past the model's rows
        tokenizer = _tokenizer_files(path, **{role: None for role in invented})
    # The engine bounds prompts itself (data.max_prompt_length, the model's positions): the tokenizer's own limit
    # (a tokenizer_config.json's model_max_length of 8) only warned "will result in indexing errors" at each run.
    tokenizer.model_max_length = VERY_LARGE_INTEGER
    try:  # many causal LMs ship without a pad token; EOS is the usual stand-in
        settle_special_tokens(tokenizer, Path(path))
    except SpecialTokenError as exc:
        raise ModelLoadError(str(exc)) from None
    tokenizer.padding_side = "left"  # prompts are left-padded so every completion starts at one column
    tokenizer.truncation_side = "left"  # over-long prompts keep their end, where the question is
    return tokenizer


@contextmanager
def hf_progress_bars_off() -> Iterator[None]:
    """transformers' own bars ("Loading weights", "Writing model shards" at each checkpoint) would break up
    the training progress bar; they are switched off while training runs."""
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


@contextmanager
def hf_warnings_off() -> Iterator[None]:
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)


def load_causal_lm(path: str, config: ModelConfig, device: torch.device, tensor_parallel: int = 1,
                   keep_on_cpu: bool = False) -> PreTrainedModel:
    """A local HF causal-LM directory, in the configured dtype and attention implementation for `device`;
    sharded over the `tensor_parallel` processes (all of them) with the model's tensor-parallel plan when that is
    > 1. `keep_on_cpu` leaves it on the CPU (FSDP moves only each process's shard to `device`)."""
    if not Path(path).is_dir():
        raise ModelLoadError(f"model path {path!r} is not a directory (model.name_or_path / --model)")
    if not (Path(path) / "config.json").is_file():
        raise ModelLoadError(f"model path {path!r} has no config.json: not a Hugging Face model directory")
    sharding = {}
    if tensor_parallel > 1:
        if not getattr(AutoConfig.from_pretrained(path), "base_model_tp_plan", None):
            raise ModelLoadError(f"model.tensor_parallel > 1 needs a model with a tensor-parallel plan, and the "
                                 f"config of {path!r} has none (base_model_tp_plan): use model.tensor_parallel 1")
        sharding = dict(distributed_config=DistributedConfig(tp_plan="auto", tp_size=tensor_parallel))
    try:
        # its table of missing / unexpected / other-shaped weights (a config.json of other sizes than the weights
        # raised "You set `ignore_mismatched_sizes` to `False`"): check_loaded_weights says it in a line
        with hf_warnings_off():
            model, info = AutoModelForCausalLM.from_pretrained(
                path, dtype=resolve_dtype(config.dtype, device), output_loading_info=True, ignore_mismatched_sizes=True,
                attn_implementation=resolve_attn_implementation(config.attn_implementation, device), **sharding)
    except Exception as exc:  # safetensors' own error on a damaged file, transformers' many types: one line
        raise ModelLoadError(f"could not load the model at {path!r}: {type(exc).__name__}: "
                             f"{' '.join(str(exc).split())[:300]}") from None
    check_loaded_weights(path, info)
    if tensor_parallel == 1:  # a sharded model's weights are the same files, checked by the single-process loads
        check_finite_weights(model, path)
    if tensor_parallel > 1:
        return model  # TP places its shards itself; a single-process load of the same files checks the attention
    if not keep_on_cpu:
        model = model.to(device)
    # FSDP's whole model too, on the CPU before sharding: a BERT masked LM otherwise trained under model.fsdp
    check_causal_attention(model, path, ModelLoadError)
    return model


def check_finite_weights(model: nn.Module, path: str) -> None:
    """Weights holding NaN or inf (a diverged run's save, a damaged export) would load and generate garbage with no
    error: refused naming the first such tensor."""
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if tensor.is_floating_point() and tensor.device.type != "meta" and not bool(torch.isfinite(tensor).all()):
            raise ModelLoadError(f"the model at {path!r} holds NaN or inf in {name!r}: not weights that can generate "
                                 f"(a diverged run's save?); load another model or checkpoint")


def name_after_hub_id(model: PreTrainedModel, hub_id: str) -> None:
    """Records the Hub id a model was loaded by (from its cache directory) as its name: peft writes that name into
    a LoRA checkpoint's adapter_config.json as the base to load, which then works on any machine."""
    model.config._name_or_path = hub_id
    model.name_or_path = hub_id


def name_by_absolute_path(model: PreTrainedModel) -> None:
    """A model loaded from a local directory is named by that directory's absolute path: peft writes the name into
    each LoRA checkpoint's adapter_config.json as the base to load, which then works from any working directory.
    A Hub id (no local directory of that name) stays the id."""
    name = getattr(model, "name_or_path", None) or model.config._name_or_path
    if name and Path(name).expanduser().is_dir():
        absolute = str(Path(name).expanduser().resolve())
        model.config._name_or_path = absolute
        model.name_or_path = absolute


def add_lora(model: PreTrainedModel, lora: LoraConfig) -> nn.Module:
    try:
        import peft
    except ImportError as exc:
        raise ModelLoadError("model.lora.enabled needs the `peft` package: pip install peft") from exc
    problem = lora_targets_problem(model, lora.target_modules)  # preflight said it before loading, for train
    if problem:
        raise ModelLoadError(problem)
    peft_config = peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                  target_modules=lora.target_modules, task_type="CAUSAL_LM")
    name_by_absolute_path(model)
    return peft.get_peft_model(model, peft_config)


def load_lora_adapters(model: PreTrainedModel, adapter_dir: str) -> nn.Module:
    import peft

    name_by_absolute_path(model)
    return peft.PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)


def is_peft_model(model: nn.Module) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def base_causal_lm(model: nn.Module) -> PreTrainedModel:
    """The transformers model under a peft wrapper (LoRA layers are injected into it in place)."""
    return model.get_base_model() if is_peft_model(model) else model


def with_lm_head(model: nn.Module, hidden: torch.Tensor,
                 fn: Callable[[torch.Tensor, torch.Tensor, dict], Any]) -> Any:
    """fn(hidden, weight [V, H], head) with the LM head's whole weight (the embedding matrix when tied):
    gathered under DeepSpeed ZeRO-3 and FSDP2, and never a shard (grpo_kernels.integrations.sharding) -- except
    a tensor-parallel head (transformers' tp_plan), whose DTensor shards the kernels take as they are. `head`
    holds the rest of what the head's logits need, as keyword arguments of the kernels' functions: `bias` and
    the model's `logit_transform` (a Gemma-2 soft-cap, a Cohere scale, ...: read from its config)."""
    lm = base_causal_lm(model)
    transform = logit_transform(lm)
    head = lm.get_output_embeddings()
    if is_vocab_parallel_head(head, tensor_parallel_model=is_tensor_parallel(lm)):
        return fn(hidden, head.weight, dict(bias=head.bias, logit_transform=transform))
    # The padding rows past the tokenizer (limits.py) are never sampled, so never scored: the first rows only.
    rows = getattr(lm, SCORED_VOCAB_ATTR, None)

    def scored(h: torch.Tensor, weight: torch.Tensor, bias: Any) -> Any:
        if rows is not None:
            weight, bias = weight[:rows], None if bias is None else bias[:rows]
        return fn(h, weight, dict(bias=bias, logit_transform=transform))

    return call_with_full_head(scored, hidden, head)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    # Left padding: real tokens are numbered from 0 as `generate` numbers them, pads get 0 (ignored).
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class HiddenStatePolicy(nn.Module):
    """Runs a causal LM's decoder and returns its last (final-norm) hidden states [B, L, H]."""

    # Every process takes every decoding step of `generate` (transformers' synced_gpus): set under FSDP, where
    # each step gathers the sharded layers from all processes (grpo_engine.model.fsdp).
    synced_generation = False

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    @property
    def generation_config(self) -> Any:
        return getattr(self.lm, "generation_config", None)

    def generate(self, **kwargs: Any) -> torch.Tensor:
        """The LM's `generate`, as a method of this module so that FSDP2 can run its hooks around it."""
        if self.synced_generation:
            kwargs["synced_gpus"] = True
        return self.lm.generate(**kwargs)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor],
                position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """A padded batch (`attention_mask`), or packed sequences: no mask and `position_ids` restarting at 0 for
        each sequence, from which transformers confines attention to each (grpo_engine.steps.packing)."""
        decoder = base_causal_lm(self.lm).get_decoder()
        if position_ids is None:
            position_ids = position_ids_from_mask(attention_mask)
        out = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        return out.last_hidden_state


def frozen_copy(model: PreTrainedModel) -> PreTrainedModel:
    """A gradient-free copy used as the KL reference when the policy is fully fine-tuned."""
    reference = copy.deepcopy(model)
    reference.requires_grad_(False)
    return reference.eval()


def enable_gradient_checkpointing(model: nn.Module) -> None:
    lm = base_causal_lm(model)
    # transformers >= 5.2x renamed it (the old name warns); 5.17, the oldest supported, has only the old one
    enable = getattr(lm, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    lm.config.use_cache = False
    if is_peft_model(model):
        # With frozen embeddings, checkpointed blocks would see inputs without grad and drop adapter grads.
        lm.enable_input_require_grads()
