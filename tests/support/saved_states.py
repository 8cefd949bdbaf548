"""A checkpoint's torch files as the engine writes them (optimizer, scheduler, RNG states, a sharded state's files,
the model's safetensors), for a small model that trained one step: what a resume reads and checks
(grpo_engine/state/saved_state.py) before any model loads."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file

from grpo_engine.state import checkpoint as ckpt


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(7, 4), torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))


def optimizer_and_scheduler(model: torch.nn.Module):
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def train_step(model: torch.nn.Module, optimizer, scheduler) -> None:
    model(torch.tensor([1, 2])).sum().backward()
    optimizer.step()
    scheduler.step()


def trained_states() -> dict:
    """The optimizer, scheduler and RNG states of `small_model` after one step, as the engine saves them."""
    model = small_model()
    optimizer, scheduler = optimizer_and_scheduler(model)
    train_step(model, optimizer, scheduler)
    return {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "rng": ckpt.plain_rng_state(ckpt.rng_state())}


def write_states(path: Path, states: dict, optimizer_file: str = "optimizer.pt") -> None:
    """`states` (trained_states, edited or not) as a checkpoint's files, with the model's weights and trainer state;
    no optimizer file where `states` has none."""
    (path / "model").mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in small_model().state_dict().items()}, path / "model" / "model.safetensors")
    (path / ckpt.STATE_FILE).write_text('{"step": 1, "sampler": {"epoch": 0, "offset": 0}}')
    for key, file in (("optimizer", optimizer_file), ("scheduler", "scheduler.pt"), ("rng", "rng-0.pt")):
        if key in states:
            torch.save(states[key], path / file)


def write_sharded_state(directory: Path) -> Path:
    """A sharded checkpoint's files as save_sharded_state writes them (one process here); its .metadata."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = small_model()
    optimizer, scheduler = optimizer_and_scheduler(model)
    train_step(model, optimizer, scheduler)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled, unavailable or uninitialized"
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(directory))
    return directory / ".metadata"
