"""A directory of LoRA adapters against the base model its adapter_config.json names, before any weight loads.

The base named there is often not the model the adapters were trained on (a config copied from another run, a base
edited by hand, a directory since replaced by another model): peft then failed after both models had loaded, with
"Error(s) in loading state_dict for PeftModelForCausalLM: size mismatch for ...lora_A..." (a list of every
adapter), or "Target modules {'qq_proj'} not found in the base model", neither naming the file that says which
base. Here the adapters' own shapes (their file's header) and target_modules are matched against the base built on
the meta device: one line naming adapter_config.json, the adapter and the base.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from torch import nn

from .lora_targets import matches_target, model_skeleton
from .weight_files import stored_tensors

ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")
PEFT_PREFIX = "base_model.model."  # what peft's saved names start with, before the base model's module names
# peft's saved names of a LoRA layer's two factors, each with its dimension that is the base layer's input size
# (0) or output size (1): A is [r, in_features], B is [out_features, r]
FACTORS = {".lora_A.weight": (1, 0), ".lora_B.weight": (0, 1), ".lora_embedding_A": (1, 0),
           ".lora_embedding_B": (0, 1)}


def adapter_fit_problem(adapter_dir: Path, adapters: dict[str, Any], base_config: Any, base: str) -> Optional[str]:
    """Why the adapters in `adapter_dir` (`adapters`: its adapter_config.json) do not fit the base model
    `base_config` describes (`base`: as adapter_config.json names it), in one line, or None (also when the base
    cannot be built without weights: its load says why)."""
    skeleton = model_skeleton(base_config)
    if skeleton is None:
        return None
    where = f"{adapter_dir / 'adapter_config.json'} names the base model {base!r}"
    targets = adapters.get("target_modules")
    if isinstance(targets, list):  # a single text is a regular expression to peft: its own match says
        names = [name for name, _ in skeleton.named_modules()]
        missing = [target for target in targets if isinstance(target, str)
                   and not any(matches_target(name, target) for name in names)]
        if missing:
            return (f"{where}, which has no module its target_modules {missing[0]!r} names: name the model the "
                    f"adapters were trained on")
    return _shape_problem(adapter_dir, skeleton, where)


def _shape_problem(adapter_dir: Path, skeleton: nn.Module, where: str) -> Optional[str]:
    """The first adapter whose shape does not fit the base module it adapts, or that adapts no module of it."""
    path = next((adapter_dir / name for name in ADAPTER_FILES if (adapter_dir / name).is_file()), None)
    if path is None:
        return None  # peft's own message names the missing file
    modules = dict(skeleton.named_modules())
    for name, stored in stored_tensors(path).items():
        factor = next((suffix for suffix in FACTORS if name.endswith(suffix)), None)
        if factor is None:
            continue
        module_name = name.removeprefix(PEFT_PREFIX)[: -len(factor)]
        if module_name not in modules:
            return f"{where}, which has no module {module_name!r} for the adapter {name!r} in {path.name}"
        sizes = _in_out(modules[module_name])
        ours, which = FACTORS[factor]
        if sizes is not None and (len(stored.shape) != 2 or stored.shape[ours] != sizes[which]):
            return (f"{where}, whose {module_name} takes {sizes[0]} and gives {sizes[1]} features: the adapter "
                    f"{name!r} in {path.name} is {stored.shape}, trained on another model; name the model the "
                    f"adapters were trained on")
    return None


def _in_out(module: nn.Module) -> Optional[tuple[int, int]]:
    """(input size, output size) of a layer LoRA adapts with two matrices; None for another (a convolution)."""
    from transformers.pytorch_utils import Conv1D

    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if isinstance(module, nn.Embedding):
        return module.num_embeddings, module.embedding_dim
    if isinstance(module, Conv1D):  # GPT-2's: its weight stored [in, out]
        return module.weight.shape[0], module.weight.shape[1]
    return None
