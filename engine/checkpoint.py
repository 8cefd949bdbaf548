"""Atomic, resumable checkpoints: HF-format model (or LoRA adapters) + tokenizer, optimizer, scheduler,
every process's RNG state and the data position.

A checkpoint is written to a hidden temporary directory and renamed into place only when complete, so an
interrupted save never replaces (or corrupts) the last good one; loaders ignore the temporary names.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from accelerate import Accelerator

PREFIX = "checkpoint-"
STATE_FILE = "trainer_state.json"


class CheckpointError(RuntimeError):
    pass


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def resolve_resume(resume: str, run_dir: str | Path) -> Path:
    if resume == "latest":
        found = list_checkpoints(run_dir)
        if not found:
            raise CheckpointError(f"run.resume='latest' but {checkpoint_root(run_dir)} has no complete checkpoint")
        return found[-1]
    path = Path(resume)
    if not (path / STATE_FILE).is_file():
        raise CheckpointError(f"run.resume {resume!r} is not a checkpoint directory (no {STATE_FILE})")
    return path


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(accelerator: Accelerator, run_dir: str | Path, step: int, lm: torch.nn.Module, tokenizer,
                    optimizer: torch.optim.Optimizer, scheduler, trainer_state: dict[str, Any],
                    keep_last: int) -> Path:
    """Write checkpoint-<step> atomically on every process's behalf; returns its path."""
    root = checkpoint_root(run_dir)
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f".tmp-{PREFIX}{step:06d}"
    if accelerator.is_main_process:
        if tmp.exists():
            shutil.rmtree(tmp)  # the leftovers of an interrupted save
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    # Each process keeps its own RNG stream (sampling differs per process).
    torch.save(rng_state(), tmp / f"rng-{accelerator.process_index}.pt")
    state_dict = accelerator.get_state_dict(lm) if accelerator.distributed_type.name.startswith("FSDP") else None
    if accelerator.is_main_process:
        lm.save_pretrained(tmp / "model", state_dict=state_dict, safe_serialization=True)
        tokenizer.save_pretrained(tmp / "model")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        (tmp / STATE_FILE).write_text(json.dumps({**trainer_state, "step": step}, indent=2))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():  # re-saving a step (a resumed run): swap, then drop the old copy
            stale = root / f".old-{PREFIX}{step:06d}"
            os.replace(final, stale)
            os.replace(tmp, final)
            shutil.rmtree(stale)
        else:
            os.replace(tmp, final)
        for old in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


def load_training_state(path: Path, process_index: int) -> dict[str, Any]:
    """Trainer state, optimizer and scheduler state dicts, and this process's RNG state."""
    rng_file = path / f"rng-{process_index}.pt"
    if not rng_file.is_file():
        raise CheckpointError(f"{path} has no RNG state for process {process_index}: it was saved with fewer "
                              f"processes; resume with the same number of processes")
    return {
        "trainer": json.loads((path / STATE_FILE).read_text()),
        "optimizer": torch.load(path / "optimizer.pt", weights_only=False),
        "scheduler": torch.load(path / "scheduler.pt", weights_only=False),
        "rng": torch.load(rng_file, weights_only=False),
    }


def model_dir(path: Optional[Path]) -> Optional[str]:
    return None if path is None else str(path / "model")
