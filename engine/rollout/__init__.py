"""Rollout backends behind one interface (base.RolloutBackend), chosen by `rollout.backend`.

`hf` samples with Hugging Face `generate` on the policy itself; `vllm` runs a vLLM engine colocated in the
training process and syncs the policy's weights into it after every optimizer step; `vllm_server` asks vLLM
servers over HTTP and pushes the weights to them. vLLM is an optional extra: its module is imported only when it
is chosen.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from ..config import ROLLOUT_BACKENDS as BACKENDS
from ..config import EngineConfig
from .base import RolloutBackend, RolloutBatch, encode_prompts, eos_ids, finish_batch, mask_after_eos
from .hf import HFRollout, generate_completions


def check_backend(config: EngineConfig, device: torch.device, num_processes: int = 1, process_index: int = 0) -> None:
    """What the configured backend cannot do on `device` over `num_processes` with this install, said before
    anything loads."""
    if config.rollout.backend == "vllm":
        from .vllm import check_vllm

        check_vllm(config, device, num_processes)
    elif config.rollout.backend == "vllm_server":
        from .server import check_servers_up

        check_servers_up(config, process_index)


def create_backend(config: EngineConfig, generation_model: nn.Module, lm: nn.Module,
                   tokenizer: PreTrainedTokenizerBase, device: torch.device, model_dir: str,
                   world: Optional[object] = None, run_dir: str = ".", start_version: int = 0) -> RolloutBackend:
    """The configured backend. `generation_model` is what `hf` calls `generate` on; vLLM starts from the weights
    in `model_dir` and takes the policy `lm`'s weights at every sync; `world` (accelerate) tells it the processes.
    A server backend is given the policy at once, as version `start_version` (the optimizer rounds it holds)."""
    if config.rollout.backend == "vllm_server":
        from .server import VLLMServerRollout

        backend = VLLMServerRollout(config, lm, tokenizer, device, run_dir, world)
        backend.sync_weights(start_version)
        return backend
    if config.rollout.backend == "vllm":
        from .vllm import VLLMRollout

        return VLLMRollout(config, lm, tokenizer, device, model_dir, world)
    return HFRollout(generation_model, tokenizer, config.rollout, config.data.max_prompt_length, device)


__all__ = ["BACKENDS", "HFRollout", "check_backend", "RolloutBackend", "RolloutBatch", "create_backend",
           "encode_prompts", "eos_ids",
           "finish_batch", "generate_completions", "mask_after_eos"]
