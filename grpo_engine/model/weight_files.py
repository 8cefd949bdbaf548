"""The weight files transformers loads (safetensors, else pickled PyTorch files), checked from their headers (and,
for a tied head, two tensors) before any weight loads, each refusal one line naming the file and the tensor.

transformers cast a weight stored as an integer type (int8, uint8, int32, bool) to the model's float dtype without a
word when config.json has no quantization_config (a conversion script's mistake, or a quantized model's config
without its quantization settings): the model trained from those rounded values. A header that is not one (a
truncated download) failed only once the run directory was written. And config.json's `tie_word_embeddings: true`
beside a saved `lm_head.weight` that differs from the embeddings leaves which head is meant to the loader: older
releases replaced the saved head by the embeddings, 5.x keeps it and unties with a warning the engine silences, and
either way the config and the weights say two things. The same held for a pickled pytorch_model.bin (read onto the
meta device: types without values), and for shards that disagree with their index (a tensor the index places in a
shard that lacks it failed after the load as "is config.json from another model?") or with each other (a tensor
saved in two shards: the loader kept one copy without a word).
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Optional

# safetensors' dtype names of floating types: anything else (I8, U8, I32, I64, BOOL, ...) in a weight of a model
# without quantization_config is an integer where the model computes in floats
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4")


# The weight files transformers reads, in its order of preference: the single file, else its index's shards;
# safetensors before pickled PyTorch files
WEIGHT_SOURCES = (("model.safetensors", "model.safetensors.index.json"),
                  ("pytorch_model.bin", "pytorch_model.bin.index.json"))


@dataclass(frozen=True)
class WeightFiles:
    """The weight files transformers reads, and for sharded ones their index and the file it names for each
    tensor."""

    files: list[Path]
    index: Optional[Path] = None
    named: dict[str, Path] = field(default_factory=dict)


def weight_files(directory: Path) -> WeightFiles:
    """model.safetensors, else the shards its index names, else the same of pytorch_model.bin (model_files.py
    checked the index); no files for a directory of neither."""
    for single, index in WEIGHT_SOURCES:
        if (directory / single).is_file():
            return WeightFiles([directory / single])
        if (directory / index).is_file():
            weight_map = json.loads((directory / index).read_text(encoding="utf-8"))["weight_map"]
            named = {name: directory / shard for name, shard in weight_map.items()}
            return WeightFiles(sorted(set(named.values())), directory / index, named)
    return WeightFiles([])


class Stored(NamedTuple):
    """A tensor as a weight file's header describes it."""

    dtype: str  # its stored type, as the file names it (safetensors' "I8", torch's "int8")
    is_float: bool
    shape: list[int]


def stored_tensors(path: Path) -> dict[str, Stored]:
    """Each tensor of the weight file `path`, read as transformers reads its header. A pickled file is read onto
    the meta device (types and shapes, no values)."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as weights:
            return {name: Stored(part.get_dtype(), part.get_dtype() in FLOAT_DTYPES, list(part.get_shape()))
                    for name in weights.keys() for part in [weights.get_slice(name)]}
    import torch

    state = torch.load(str(path), map_location="meta", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"it holds a {type(state).__name__}, not a mapping of tensor names to tensors")
    return {name: Stored(str(tensor.dtype).removeprefix("torch."), tensor.is_floating_point(), list(tensor.shape))
            for name, tensor in state.items() if isinstance(tensor, torch.Tensor)}


def _read_tensor(path: Path, name: str) -> Any:
    import torch

    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as weights:
            return weights.get_tensor(name)
    return torch.load(str(path), map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))[name]


def weight_files_problem(directory: Path, config: Any) -> Optional[str]:
    """What keeps the weight files of `directory` from loading as `config` (what transformers built from config.json)
    describes them, as one line naming the file, or None."""
    from safetensors import SafetensorError

    quantized = getattr(config, "quantization_config", None) is not None
    found = weight_files(directory)
    where: dict[str, Path] = {}  # tensor name -> its file
    for path in found.files:
        try:
            stored = stored_tensors(path)
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:  # RuntimeError: torch.load's own
            text = " ".join(str(exc).split())[:200]
            kind = "safetensors" if path.suffix == ".safetensors" else "PyTorch weights"
            return f"{path} is not a {kind} file transformers can read ({type(exc).__name__}: {text})"
        for name, (dtype, is_float, _) in stored.items():
            if name in where:  # which copy loads is the loader's choice: the two shards say two things
                return (f"{path} and {where[name]} both hold tensor {name!r}: a sharded checkpoint holds each tensor "
                        f"once; save the model again (save_pretrained)")
            where[name] = path
            if not quantized and not is_float and name.endswith((".weight", ".bias")):
                return (f"{path}: tensor {name!r} is stored as {dtype}, not a float type, and config.json has "
                        f"no quantization_config: transformers would cast it to floats silently; save the "
                        f"model's weights in their float dtype (or add the quantization settings it was "
                        f"saved with)")
    return _index_problem(found, where) or _tied_head_problem(directory, config, where)


def _index_problem(found: WeightFiles, where: dict[str, Path]) -> Optional[str]:
    """The index names a shard for a tensor that shard does not hold (an index of another save beside these shards:
    the load took its tensors for missing ones, and said "is config.json from another model?")."""
    for name, shard in found.named.items():
        if where.get(name) != shard:
            held = f"it is in {where[name].name}" if name in where else "no shard holds it"
            return (f"{found.index} names {shard.name} for tensor {name!r}, which that file does not hold "
                    f"({held}): the index and the shards are of different saves; save the model again "
                    f"(save_pretrained)")
    return None


def _tied_head_problem(directory: Path, config: Any, where: dict[str, Path]) -> Optional[str]:
    """config.json ties the head to the embeddings, and the files hold a head that differs from them."""
    import torch

    from .lora_targets import model_skeleton

    if not getattr(config, "tie_word_embeddings", False):
        return None
    skeleton = model_skeleton(config)
    if skeleton is None or skeleton.get_output_embeddings() is None:
        return None
    modules = {module: name for name, module in skeleton.named_modules()}
    embed = modules.get(skeleton.get_input_embeddings())
    head = modules.get(skeleton.get_output_embeddings())
    names = [f"{embed}.weight", f"{head}.weight"]
    if embed is None or head is None or any(name not in where for name in names):
        return None  # one of the two saved: nothing to disagree
    tensors = [_read_tensor(where[name], name) for name in names]
    if tensors[0].shape == tensors[1].shape and torch.equal(tensors[0], tensors[1]):
        return None
    return (f"{directory / 'config.json'}: tie_word_embeddings is true, but {where[names[1]]} holds an {names[1]} "
            f"that differs from {names[0]}: set tie_word_embeddings false to train the saved head, or save the model "
            f"without its own head to tie it")
