"""Fully sharded data parallelism (`model.fsdp`): parameters, gradients and AdamW state sharded over the
processes with FSDP2 (`torch.distributed.fsdp.fully_shard`).

Every process is a data-parallel rank, as under DDP (its own share of the batch, gradients averaged), but holds
only 1/N of every weight, gradient and optimizer state. `fully_shard` is applied to each decoder layer (a layer's
weights are gathered for its forward and backward only) and then to the `HiddenStatePolicy` around the model:
the root group holds what is outside the layers (the embedding, the final norm and the LM head, tied or not).
FSDP2 keeps the root gathered from its forward until the backward, so the fused loss reads the whole LM-head
weight as a plain tensor right after the forward and its gradient joins the embedding's in FSDP's
reduce-scatter. Generation goes through the root too (`generate` is registered as a forward method), and every
process takes every decoding step (`synced_gpus`), since each step gathers the layers.

Checkpoints: `model/` holds whole weights gathered onto the main process (it loads without FSDP), and
`sharded/` each process's shard of the weights and AdamW state (`torch.distributed.checkpoint`), from which a
run resumes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method

from ..config import ConfigError, EngineConfig
from ..state.checkpoint_error import CheckpointError
from .loading import HiddenStatePolicy, base_causal_lm

MESH_DIM = "dp"  # not "tp": grpo_kernels reads a head on a ("tp",) mesh as vocabulary-parallel


def check_fsdp(config: EngineConfig, num_processes: int) -> None:
    """`model.fsdp` shards over 2 or more processes (its combinations with LoRA and tensor parallelism are the
    schema's rules)."""
    if not config.model.fsdp:
        return
    if num_processes < 2:
        raise ConfigError("model.fsdp needs 2 or more processes (it shards over them): launch with "
                          "`torchrun --nproc_per_node N -m grpo_engine train ...`, or set model.fsdp false")


def data_parallel_mesh(device: torch.device) -> DeviceMesh:
    """A 1-D mesh over every process (the process group accelerate started)."""
    return init_device_mesh(device.type, (torch.distributed.get_world_size(),), mesh_dim_names=(MESH_DIM,))


def decoder_layers(lm: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: modules of the classes transformers keeps whole (`_no_split_modules`)."""
    model = base_causal_lm(lm)
    block_classes = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in block_classes]
    if not layers:
        raise ConfigError(f"model.fsdp: {type(model).__name__} names no decoder-layer class (_no_split_modules), "
                          f"so there is nothing to shard layer by layer; use model.fsdp false")
    return layers


def shard_policy(policy: HiddenStatePolicy, mesh: DeviceMesh) -> HiddenStatePolicy:
    """`fully_shard` each decoder layer, then the policy (the root); the shards move to the mesh's device."""
    for layer in decoder_layers(policy.lm):
        fully_shard(layer, mesh=mesh)
    fully_shard(policy, mesh=mesh)
    register_fsdp_forward_method(policy, "generate")  # gathers the root (embedding, norm, head) for generate
    policy.synced_generation = True
    return policy


def is_fully_sharded(model: nn.Module) -> bool:
    return any(isinstance(module, FSDPModule) for module in model.modules())


def reshard(module: nn.Module) -> None:
    """Free the gathered root parameters of an FSDP module that will not run a backward (the frozen reference),
    which FSDP2 would otherwise keep whole until the next one."""
    if isinstance(module, FSDPModule):
        module.reshard()


def full_state_dict(lm: nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights, gathered one tensor at a time onto the main process's CPU (empty on the others).
    Every process must call it."""
    return get_model_state_dict(lm, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_sharded_state(directory: Path, lm: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every process writes its shard of the weights and AdamW state (parameter names are the model's own)."""
    model_state, optimizer_state = get_state_dict(lm, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(directory))


def load_sharded_state(directory: Path, lm: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Loads `save_sharded_state`'s files into the sharded model and its optimizer (every process)."""
    model_state, optimizer_state = get_state_dict(lm, optimizer)  # templates with this process's shards
    state: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state}
    try:
        dcp.load(state, checkpoint_id=str(directory))
    except Exception as exc:  # DCP wraps a reader's failure in its own types; the directory is what matters
        raise CheckpointError(f"cannot read the sharded checkpoint {directory}: {type(exc).__name__}: {exc}") from exc
    set_state_dict(lm, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
