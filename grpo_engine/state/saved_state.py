"""A checkpoint's torch files (optimizer, scheduler, RNG states): read without running code, and checked against
what this run builds before any model weight loads.

`torch.load(weights_only=False)` unpickles anything, so a checkpoint file that someone swapped could run code the
moment a resume read it; the engine reads its files with `weights_only=True`, which admits tensors and plain values
only (and numpy's arrays, which RNG states saved before they were written as plain lists hold). A file that needs
more is refused in one line naming it and the first object it asks for.

What was refused only after the model loaded, deep in torch (an optimizer state of another model: "loaded state
dict contains a parameter group that doesn't match the size of optimizer's group"; an RNG state of another
generator), is checked here first: each state is applied to throwaway objects of the kinds the run builds (a
scheduler, Python's / numpy's / torch's generators), and the optimizer's per-parameter state is compared with the
shapes of the tensors the run will load (read from the safetensors headers: no weight is read).
"""

from __future__ import annotations

import math
import pickle
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import torch
from contextlib import contextmanager

from .checkpoint_error import CheckpointError

# What an RNG state saved before the numpy state was written as a plain list holds: numpy arrays (uint32 keys).
_NUMPY_ARRAY_GLOBALS = [np.ndarray.__reduce__(np.zeros(1))[0], np.ndarray, np.dtype, type(np.dtype(np.uint32))]
RNG_KEYS = {"python", "numpy", "torch"}  # and "cuda" where the saving machine had a GPU


def load_plain(file: Path) -> Any:
    """The objects of a torch file the engine wrote, with `weights_only=True`; CheckpointError in one line naming
    `file` when it asks for anything else (a global weights_only refuses), or cannot be read at all."""
    try:
        with torch.serialization.safe_globals(_NUMPY_ARRAY_GLOBALS):
            return torch.load(file, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        asked = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = f" ({asked.group(1)})" if asked else ""
        raise CheckpointError(f"{file} holds objects other than tensors and plain values{what}, which the engine "
                              f"never writes and does not load (loading them could run code); resume from another "
                              f"checkpoint") from None
    except Exception as exc:  # torch.load raises many types on a damaged file; the name is what matters
        raise CheckpointError(f"cannot read {file}: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}") \
            from None


# What the metadata file of a sharded (FSDP) checkpoint may name, which torch.distributed.checkpoint reads with
# pickle.load, unrestricted: its own record types, torch's sizes, dtypes, layouts and memory formats, paths.
_SHARDED_METADATA_MODULES = ("torch.distributed.checkpoint.metadata",)
_SHARDED_METADATA_GLOBALS = {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
                             ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
                             ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"), ("pathlib", "PureWindowsPath"),
                             ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset")}
_TORCH_CONSTANT_TYPES = (torch.dtype, torch.layout, torch.memory_format)


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that builds only the records a sharded checkpoint's metadata holds, naming anything else."""

    def find_class(self, module: str, name: str) -> Any:
        value = super().find_class(module, name) if module.split(".")[0] in ("torch", "pathlib", "collections",
                                                                             "builtins") else None
        allowed = ((module in _SHARDED_METADATA_MODULES and isinstance(value, type))
                   or (module, name) in _SHARDED_METADATA_GLOBALS
                   or (module == "torch" and isinstance(value, _TORCH_CONSTANT_TYPES)))
        if not allowed:
            raise pickle.UnpicklingError(f"GLOBAL {module}.{name}")
        return value


def check_sharded_metadata(file: Path) -> None:
    """`file` (a sharded checkpoint's .metadata, which torch.distributed.checkpoint unpickles as it is) names only
    the records such a file holds: CheckpointError in one line naming it otherwise, before anything loads it."""
    try:
        with file.open("rb") as handle:
            _MetadataUnpickler(handle).load()
    except pickle.UnpicklingError as exc:
        raise CheckpointError(f"{file} holds objects other than a sharded checkpoint's records ({exc}), which the "
                              f"engine does not load (loading them could run code); resume from another checkpoint") \
            from None
    except Exception as exc:
        raise CheckpointError(f"cannot read {file}: {type(exc).__name__}: {' '.join(str(exc).split())[:160]}") \
            from None


def plain_rng_state(state: dict[str, Any]) -> dict[str, Any]:
    """`state` (checkpoint.rng_state) with numpy's key array as a list of ints: loadable with weights_only."""
    name, keys, *rest = state["numpy"]
    return {**state, "numpy": (name, [int(key) for key in keys], *rest)}


@contextmanager
def _refusing(file: Path, expected: str) -> Iterator[None]:
    """Whatever a dry run of a state raises becomes one line naming `file` and what it should hold."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"cannot resume from {file}: it does not hold {expected} ({type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:160]}); resume from another checkpoint") from None


def check_rng_state(state: Any, file: Path) -> None:
    """`state` sets Python's, numpy's and torch's generators (tried on throwaway ones); CUDA's states, which only
    a GPU can try, are byte tensors."""
    with _refusing(file, "the RNG states the engine saves"):
        if not isinstance(state, dict) or not RNG_KEYS <= state.keys() <= RNG_KEYS | {"cuda"}:
            found = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"holds {found}, not the generators {sorted(RNG_KEYS)} (and 'cuda')")
        random.Random().setstate(state["python"])
        np.random.RandomState().set_state(state["numpy"])
        torch.Generator().set_state(state["torch"])
        cuda = state.get("cuda", [])
        if not isinstance(cuda, list) or not all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8
                                                 and t.dim() == 1 for t in cuda):
            raise ValueError("'cuda' is not a list of byte tensors")


def check_scheduler_state(state: Any, file: Path) -> None:
    """`state` loads into the LambdaLR over one parameter group the run builds (tried on a throwaway one), with a
    step count and learning rates that are numbers a schedule reaches."""
    with _refusing(file, "the learning-rate schedule the engine saves"):
        if not isinstance(state, dict) or not {"base_lrs", "last_epoch", "lr_lambdas"} <= state.keys():
            raise ValueError(f"holds {sorted(state) if isinstance(state, dict) else type(state).__name__}")
        last, lrs = state["last_epoch"], state["base_lrs"]
        if not (isinstance(last, int) and not isinstance(last, bool) and last >= 0):
            raise ValueError(f"last_epoch is {last!r:.40}, not a step count")
        if not (isinstance(lrs, list) and len(lrs) == 1 and isinstance(lrs[0], (int, float))
                and math.isfinite(lrs[0]) and lrs[0] >= 0):
            raise ValueError(f"base_lrs is {lrs!r:.60}, not one learning rate")
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0).load_state_dict(dict(state))


def _shape(tensor: Any) -> Optional[tuple[int, ...]]:
    return tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else None


def check_optimizer_state(state: Any, file: Path, parameter_shapes: Optional[list[tuple[int, ...]]],
                          exact: bool = False) -> None:
    """`state` is AdamW's over one parameter group; with `parameter_shapes` (the shapes of the tensors the run
    loads, where known), each parameter's moments have the shape of one of them and there are no more parameters
    than them; `exact`: as many (the tensors are all trained: LoRA's adapters; a whole model's file may also hold
    buffers, which a header does not tell from parameters)."""
    with _refusing(file, "the AdamW state of this model that the engine saves"):
        if not isinstance(state, dict) or set(state) != {"state", "param_groups"}:
            raise ValueError(f"holds {sorted(state) if isinstance(state, dict) else type(state).__name__}")
        groups, moments = state["param_groups"], state["state"]
        if not (isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0], dict)):
            raise ValueError("param_groups is not one parameter group")
        params = groups[0].get("params")
        if not (isinstance(params, list) and all(isinstance(p, int) for p in params)
                and len(set(params)) == len(params)):
            raise ValueError("the parameter group's params are not distinct parameter indices")
        if not isinstance(moments, dict) or not set(moments) <= set(params):
            raise ValueError("its per-parameter state is not keyed by the group's parameters")
        shapes = []
        for index, entry in moments.items():
            avg, avg_sq = (_shape(entry.get(k)) if isinstance(entry, dict) else None for k in ("exp_avg", "exp_avg_sq"))
            if avg is None or avg != avg_sq:
                raise ValueError(f"parameter {index}'s exp_avg and exp_avg_sq are not tensors of one shape")
            if "master" in entry and _shape(entry["master"]) != avg:  # optim.master_weights' float32 copy
                raise ValueError(f"parameter {index}'s float32 copy (master) is not a tensor of its moments' shape")
            shapes.append(avg)
        if parameter_shapes is None:
            return
        if len(params) > len(parameter_shapes) or (exact and len(params) != len(parameter_shapes)):
            raise ValueError(f"{len(params)} parameters, and the model this run loads trains "
                             f"{len(parameter_shapes)}")
        extra = Counter(shapes) - Counter(parameter_shapes)
        if extra:
            raise ValueError(f"moments of shape {list(next(iter(extra)))}, which no parameter of the model this run "
                             f"loads has")


ADAPTER_FILE = "adapter_model.safetensors"  # peft's: LoRA's trained tensors, all of them


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a saved model, less hidden ones: a file manager's `._model.safetensors` (macOS
    writes one beside each file it copies to a drive without its metadata) is no weights, and no loader reads it;
    read as weights it made an intact checkpoint "damaged"."""
    return sorted(file for file in model_dir.glob("*.safetensors") if not file.name.startswith("."))


def saved_tensor_shapes(model_dir: Path) -> Optional[list[tuple[int, ...]]]:
    """The shapes of the tensors in `model_dir`'s safetensors files (their headers only), or None where it holds
    none (a model saved in another format: nothing to compare)."""
    from safetensors import safe_open

    files = weight_files(model_dir)
    if not files:
        return None
    shapes = []
    for file in files:
        with _refusing(file, "safetensors"), safe_open(file, framework="pt") as tensors:
            shapes.extend(tuple(tensors.get_slice(name).get_shape()) for name in tensors.keys())
    return shapes
