"""The `vllm` rollout backend: a vLLM engine colocated in the training process, started once.

vLLM runs in this process (its V1 engine core in-process, VLLM_ENABLE_V1_MULTIPROCESSING=0), on the training
device, from the starting model's directory. After every optimizer step the policy's weights go into it through
vLLM's public `reload_weights` worker call, in checkpoint format (LoRA adapters merged into their base weights on
the fly; FSDP / tensor-parallel shards gathered), and its prefix cache is reset, so no rollout is drawn from stale
weights or stale cached keys. The sampler's log-probs are vLLM's processed log-probs (after temperature, top-k,
top-p): what the trainer's mismatch metric compares its own log-probs with.

Kept-set replay needs vLLM's sampling mask (`return_sampling_mask`), which vLLM returns only with its Model Runner
V2 (Triton on a GPU); where this build cannot return it, the run is refused naming rollout.replay_kept_tokens.
On CUDA: gpu_memory_utilization, sleep mode while the trainer computes, and a tensor-parallel size (external
launcher: every training process is one vLLM rank), set from rollout.vllm.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Iterator, Optional

import torch
from torch import nn
from transformers import AutoConfig, GenerationConfig, PreTrainedTokenizerBase

from ..config import VLLM_INSTALL_HINT, ConfigError, EngineConfig
from ..config.schema import MAX_SEED
from ..model.limits import attention_head_size, scored_vocab_size
from ..model.loading import base_causal_lm, resolve_dtype
from .base import RolloutBatch, encode_prompts, eos_ids, finish_batch

# Colocation: vLLM's engine core runs inside this process rather than in a child, so the policy's weights reach it
# without leaving the process. Read when vLLM is imported, hence set before.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

CPU_KV_CACHE_MB = 512  # a CPU has no gpu_memory_utilization to size the KV cache from


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ConfigError(f"rollout.backend vllm: vLLM could not be imported ({exc}); {VLLM_INSTALL_HINT}") from None
    return vllm


def sampling_mask_unavailable(device: torch.device) -> Optional[str]:
    """Why this vLLM build cannot return the kept sets of its sampler on `device`, or None when it can."""
    vllm = import_vllm()
    if "return_sampling_mask" not in inspect.signature(vllm.LLM.__init__).parameters:
        return f"vLLM {vllm.__version__} does not have (no return_sampling_mask)"
    if device.type != "cuda":
        return "vLLM returns only from its Model Runner V2, which needs Triton on a GPU (not on a CPU)"
    return None


def replay_refusal(reason: str) -> ConfigError:
    return ConfigError(f"rollout.replay_kept_tokens needs the kept sets of vLLM's sampler (its sampling mask), which "
                       f"{reason}: set rollout.replay_kept_tokens false (the trainer then scores the whole vocabulary "
                       f"and the ratios of on-policy tokens sit at the kept mass), drop top_p / top_k, or use "
                       f"rollout.backend hf")


def cpu_attention_head_sizes() -> Optional[list[int]]:
    """The head sizes vLLM's CPU attention has kernels for, as this vLLM says (None: it does not say)."""
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        return list(CPUAttentionBackend.get_supported_head_sizes())
    except (ImportError, AttributeError):
        return None


def model_config(config: EngineConfig) -> Optional[Any]:
    """The model's transformers config, read without its weights (None: a Hub id that cannot be reached now, which
    the download reports)."""
    from ..data.demo_task import build_char_tokenizer, tiny_model_config

    if config.model.name_or_path is None:
        return tiny_model_config(build_char_tokenizer())
    try:
        return AutoConfig.from_pretrained(config.model.name_or_path, revision=config.model.revision)
    except OSError:
        return None


def check_cpu_attention(config: EngineConfig) -> None:
    """vLLM's CPU attention runs only the head sizes it has kernels for; any other fails inside vLLM after loading."""
    supported, model = cpu_attention_head_sizes(), model_config(config)
    size = None if model is None else attention_head_size(model)
    if supported and size is not None and size not in supported:
        which = "the built-in demo model" if config.model.name_or_path is None else repr(config.model.name_or_path)
        raise ConfigError(f"rollout.backend vllm: vLLM's CPU attention has no kernel for head size {size} "
                          f"({which}; it runs {', '.join(map(str, supported))}): use rollout.backend hf, or a model "
                          f"with one of those head sizes")


def check_vllm(config: EngineConfig, device: torch.device, num_processes: int = 1) -> None:
    """What this vLLM install cannot do on `device` over `num_processes`, said before any model loads."""
    v = config.rollout.vllm
    import_vllm()
    if device.type != "cuda" and num_processes > 1:
        # Each process would start its own single-process vLLM inside a process group that vLLM does not
        # join; only CUDA's external launcher makes the training processes vLLM's ranks.
        raise ConfigError(f"rollout.backend vllm runs in one process on a CPU (this run has {num_processes}): "
                          f"launch one process, or use rollout.backend hf")
    if device.type != "cuda":
        for key, wanted in (("sleep", v.sleep), ("tensor_parallel_size", v.tensor_parallel_size > 1)):
            if wanted:
                raise ConfigError(f"rollout.vllm.{key} needs CUDA (this run's device is {device.type})")
        check_cpu_attention(config)
    if config.rollout.replays_kept_tokens():
        reason = sampling_mask_unavailable(device)
        if reason is not None:
            raise replay_refusal(reason)


def max_model_len(config: EngineConfig, model_dir: str) -> Optional[int]:
    """rollout.vllm.max_model_len, else the longest prompt + completion, capped at the model's positions."""
    if config.rollout.vllm.max_model_len is not None:
        return config.rollout.vllm.max_model_len
    if config.data.max_prompt_length is None:
        return None  # vLLM takes the model's own limit
    wanted = config.data.max_prompt_length + config.rollout.max_new_tokens
    positions = getattr(AutoConfig.from_pretrained(model_dir), "max_position_embeddings", None)
    return wanted if positions is None else min(wanted, positions)


def engine_args(config: EngineConfig, model_dir: str, device: torch.device, num_processes: int,
                process_index: int) -> dict[str, Any]:
    """The keyword arguments of vllm.LLM for this run."""
    v = config.rollout.vllm
    args: dict[str, Any] = dict(
        model=model_dir, dtype=str(resolve_dtype(config.model.dtype, device)).removeprefix("torch."),
        # Prompts arrive as token ids and completions leave as ids: vLLM needs no tokenizer of its own.
        skip_tokenizer_init=True, logprobs_mode="processed_logprobs", max_model_len=max_model_len(config, model_dir),
        # Replicas of one tensor-parallel group share a seed; data-parallel processes differ, as their samples do.
        seed=config.run.seed + process_index // v.tensor_parallel_size,
    )
    if v.kv_cache_mb is not None or device.type != "cuda":
        args["kv_cache_memory_bytes"] = (v.kv_cache_mb or CPU_KV_CACHE_MB) << 20
    if device.type == "cuda":
        args.update(gpu_memory_utilization=v.gpu_memory_utilization, enable_sleep_mode=v.sleep,
                    tensor_parallel_size=v.tensor_parallel_size)
        if num_processes > 1:  # each training process is a vLLM rank of its own (torchrun / accelerate launch)
            args["distributed_executor_backend"] = "external_launcher"
    else:
        args["enforce_eager"] = True  # CUDA graphs and torch.compile are GPU matters
    if config.rollout.replays_kept_tokens():
        args["return_sampling_mask"] = True
    return args


@torch.no_grad()
def checkpoint_weights(lm: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's whole weights under the names of its checkpoint: LoRA layers as base weight + adapter delta
    (computed, the module itself left untouched: merging and unmerging in place would round the base weights a
    little at every sync), and DTensor shards (FSDP2, tensor parallelism) gathered one tensor at a time."""
    from torch.distributed.tensor import DTensor

    model = base_causal_lm(lm)
    lora_layers = {name: module for name, module in model.named_modules()
                   if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer")}
    for name, tensor in model.state_dict().items():
        owner, _, leaf = name.rpartition(".")
        if ".lora_" in name or ".original_module." in name:
            continue
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        if owner.endswith(".base_layer"):
            owner = owner.removesuffix(".base_layer")
            layer = lora_layers.get(owner)
            if layer is not None and leaf == "weight":
                for adapter in layer.active_adapters:
                    tensor = tensor + layer.get_delta_weight(adapter).to(tensor.dtype)
            name = f"{owner}.{leaf}"
        yield name.replace(".modules_to_save.default.", "."), tensor


class VLLMRollout:
    """vLLM, started once from `model_dir`, given `lm`'s weights at every `sync_weights`."""

    def __init__(self, config: EngineConfig, lm: nn.Module, tokenizer: PreTrainedTokenizerBase, device: torch.device,
                 model_dir: str, world: Optional[Any] = None) -> None:
        vllm = import_vllm()
        self.config, self.lm, self.tokenizer, self.device = config, lm, tokenizer, device
        self.eos = eos_ids(tokenizer, getattr(base_causal_lm(lm), "generation_config", None) or GenerationConfig())
        self.asleep: set[str] = set()  # the sleep-mode tags now released ("weights", "kv_cache")
        # A vocabulary padded past the tokenizer (Qwen2.5): those rows are never sampled, as with hf.
        scored = scored_vocab_size(tokenizer, lm, config.rollout.sample_padded_vocab)
        self.allowed_token_ids = None if scored is None else list(range(scored))
        num_processes = getattr(world, "num_processes", 1)
        process_index = getattr(world, "process_index", 0)
        args = engine_args(config, model_dir, device, num_processes, process_index)
        # vLLM seeds the global RNGs as it starts: the training RNG stream (and so exact resume) must not notice.
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            try:
                self.llm = vllm.LLM(**args)
            except ValueError as exc:
                if args.get("return_sampling_mask") and "sampling" in str(exc):
                    raise replay_refusal(f"this vLLM setup cannot return ({exc})") from None
                raise
        self.sync_weights()  # LoRA merged, or a resumed policy: vLLM samples from what the trainer holds

    def sync_weights(self, version: int = 0) -> None:
        self._wake(["weights"])
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": checkpoint_weights(self.lm),
                                                          "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()  # cached keys and values were computed by the old weights

    def generate(self, prompts: list[str], greedy: bool = False, record_kept: bool = False) -> RolloutBatch:
        from vllm import SamplingParams

        r = self.config.rollout
        prompt_ids, prompt_mask = encode_prompts(self.tokenizer, prompts, self.config.data.max_prompt_length,
                                                 self.device)
        requests = [{"prompt_token_ids": ids[mask.bool()].tolist()} for ids, mask in
                    zip(prompt_ids.cpu(), prompt_mask.cpu())]
        common = dict(max_tokens=r.max_new_tokens, stop_token_ids=self.eos, repetition_penalty=r.repetition_penalty,
                      allowed_token_ids=self.allowed_token_ids, detokenize=False)
        if greedy:
            params = [SamplingParams(temperature=0.0, **common)] * len(prompts)
        else:
            # One seed per request from the run's torch RNG: a resumed run draws the same samples.
            seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist()
            params = [SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k if r.top_k > 0 else -1,
                                     logprobs=0, seed=seed, **common) for seed in seeds]
        self._wake(["weights", "kv_cache"])
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            outputs = [request.outputs[0] for request in self.llm.generate(requests, params, use_tqdm=False)]
        self._sleep()
        return self._batch(prompts, prompt_ids, prompt_mask, outputs, sampled=not greedy, record_kept=record_kept)

    def _batch(self, prompts: list[str], prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, outputs: list[Any],
               sampled: bool, record_kept: bool) -> RolloutBatch:
        length = max(1, max(len(o.token_ids) for o in outputs))
        ids = torch.full((len(outputs), length), self.tokenizer.pad_token_id, dtype=torch.long)
        logps = torch.zeros(len(outputs), length) if sampled else None
        kept_lists = [o.sampling_mask.token_ids for o in outputs] if sampled and record_kept else None
        for row, output in enumerate(outputs):
            ids[row, :len(output.token_ids)] = torch.tensor(output.token_ids, dtype=torch.long)
            if logps is not None:
                logps[row, :len(output.token_ids)] = torch.tensor(
                    [position[token].logprob for token, position in zip(output.token_ids, output.logprobs)])
        kept = None
        if kept_lists is not None:
            width = max(1, max(len(s) for sets in kept_lists for s in sets))
            kept = torch.full((len(outputs), length, width), -1, dtype=torch.long)
            for row, sets in enumerate(kept_lists):
                for t, kept_set in enumerate(sets):
                    kept[row, t, :len(kept_set)] = torch.tensor(kept_set, dtype=torch.long)
        to = self.device
        return finish_batch(self.tokenizer, prompts, prompt_ids, prompt_mask, ids.to(to), self.eos, self.config.rollout,
                            None if logps is None else logps.to(to), None if kept is None else kept.to(to))

    def _wake(self, tags: list[str]) -> None:
        waking = [tag for tag in tags if tag in self.asleep]
        if waking:
            self.llm.wake_up(tags=waking)
            self.asleep -= set(waking)

    def _sleep(self) -> None:
        """Sleep mode (CUDA): the weights move to host memory and the KV cache is freed while the trainer runs."""
        if self.config.rollout.vllm.sleep:
            self.llm.sleep(level=1)
            self.asleep = {"weights", "kv_cache"}


def create(context) -> VLLMRollout:
    """The rollout registry's factory (registry.py)."""
    return VLLMRollout(context.config, context.lm, context.tokenizer, context.device, context.model_dir, context.world)


def check(config: EngineConfig, device: torch.device, num_processes: int = 1, process_index: int = 0) -> None:
    """The registry's check, before anything loads: each engine samples from run.seed + its index (vllm_args), a
    seed that must stay in the RNGs' domain (NumPy's, which vLLM seeds too)."""
    last = config.run.seed + (num_processes - 1) // config.rollout.vllm.tensor_parallel_size
    if last > MAX_SEED:
        raise ConfigError(f"run.seed ({config.run.seed}): the vLLM engines sample from run.seed + their index, up to "
                          f"{last}, past {MAX_SEED}, the RNGs' largest seed; set a smaller run.seed")
    check_vllm(config, device, num_processes)
