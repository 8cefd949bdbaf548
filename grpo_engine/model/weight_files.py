"""The safetensors weight files transformers loads, checked from their headers (and, for a tied head, two tensors)
before any weight loads, each refusal one line naming the file and the tensor.

transformers cast a weight stored as an integer type (int8, uint8, int32, bool) to the model's float dtype without a
word when config.json has no quantization_config (a conversion script's mistake, or a quantized model's config
without its quantization settings): the model trained from those rounded values. A header that is not one (a
truncated download) failed only once the run directory was written. And config.json's `tie_word_embeddings: true`
beside a saved `lm_head.weight` that differs from the embeddings leaves which head is meant to the loader: older
releases replaced the saved head by the embeddings, 5.x keeps it and unties with a warning the engine silences, and
either way the config and the weights say two things.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

# safetensors' dtype names of floating types: anything else (I8, U8, I32, I64, BOOL, ...) in a weight of a model
# without quantization_config is an integer where the model computes in floats
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4")


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files transformers reads: model.safetensors, else the shards its index names (model_files.py
    checked the index); none for a directory of pickled weights alone."""
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    index = directory / "model.safetensors.index.json"
    if not index.is_file():
        return []
    shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    return [directory / shard for shard in shards]


def weight_files_problem(directory: Path, config: Any) -> Optional[str]:
    """What keeps the weight files of `directory` from loading as `config` (what transformers built from config.json)
    describes them, as one line naming the file, or None."""
    from safetensors import SafetensorError, safe_open

    quantized = getattr(config, "quantization_config", None) is not None
    where: dict[str, Path] = {}  # tensor name -> its file
    for path in weight_files(directory):
        try:
            with safe_open(str(path), framework="pt") as weights:
                for name in weights.keys():
                    where[name] = path
                    dtype = weights.get_slice(name).get_dtype()
                    if not quantized and dtype not in FLOAT_DTYPES and name.endswith((".weight", ".bias")):
                        return (f"{path}: tensor {name!r} is stored as {dtype}, not a float type, and config.json has "
                                f"no quantization_config: transformers would cast it to floats silently; save the "
                                f"model's weights in their float dtype (or add the quantization settings it was "
                                f"saved with)")
        except (SafetensorError, OSError, ValueError) as exc:
            text = " ".join(str(exc).split())[:200]
            return f"{path} is not a safetensors file transformers can read ({type(exc).__name__}: {text})"
    return _tied_head_problem(directory, config, where)


def _tied_head_problem(directory: Path, config: Any, where: dict[str, Path]) -> Optional[str]:
    """config.json ties the head to the embeddings, and the files hold a head that differs from them."""
    import torch
    from safetensors import safe_open

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
    tensors = []
    for name in names:
        with safe_open(str(where[name]), framework="pt") as weights:
            tensors.append(weights.get_tensor(name))
    if tensors[0].shape == tensors[1].shape and torch.equal(tensors[0], tensors[1]):
        return None
    return (f"{directory / 'config.json'}: tie_word_embeddings is true, but {where[names[1]]} holds an {names[1]} "
            f"that differs from {names[0]}: set tie_word_embeddings false to train the saved head, or save the model "
            f"without its own head to tie it")
