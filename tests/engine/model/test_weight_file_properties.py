"""The weight files a model directory holds, checked from their safetensors headers before any weight loads, one line
naming the file and tensor (hypothesis draws the tensor and the stored type): a float weight stored as an integer or
bool type with no quantization_config (transformers cast it silently), a header that is not one (a truncated
download failed after the run directory was written), config.json's tie_word_embeddings true beside a saved head
that differs from the embeddings; and a stray adapter_config.json beside a whole model, refused by train's preflight.
The files are drawn as transformers reads them: one file or shards with their index, safetensors or a pickled
pytorch_model.bin (whose integer weights were taken unchecked); shards that disagree with their index (a tensor in
another shard than it names: "is config.json from another model?" after the load) or with each other (a tensor
saved twice) are refused naming both."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors.torch import load_file, save_file

from grpo_engine.model.loading import ModelLoadError, check_model_dir
from grpo_engine.preflight import PreflightError, check_whole_model

STORED = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool]
CONTAINERS = st.sampled_from(["safetensors", "bin"])


def _copy(tiny_model_dir, tmp_path_factory):
    directory = tmp_path_factory.mktemp("model") / "m"
    shutil.copytree(tiny_model_dir, directory)
    return directory


def _resave(directory, edit) -> None:
    weights = load_file(directory / "model.safetensors")
    edit(weights)
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})


def _file_names(container: str, shards: int) -> list[str]:
    single = "model.safetensors" if container == "safetensors" else "pytorch_model.bin"
    return [single] if shards == 1 else [single.replace(".", f"-{i + 1:05d}-of-{shards:05d}.", 1)
                                         for i in range(shards)]


def _write(path, tensors: dict) -> None:
    if path.suffix == ".safetensors":
        save_file(tensors, path, metadata={"format": "pt"})
    else:
        torch.save(tensors, path)


def _save_as(directory, weights: dict, container: str, shards: int, index_says=None) -> dict[str, str]:
    """`weights` saved in `directory` in place of model.safetensors: one file (shards 1) or `shards` files and
    their index, which names the file `index_says(name, file)` gives for each tensor (its own by default); returns
    the file of each tensor."""
    (directory / "model.safetensors").unlink()
    files = _file_names(container, shards)
    owner = {name: files[i % len(files)] for i, name in enumerate(sorted(weights))}
    for file in files:
        _write(directory / file, {name: weights[name].contiguous() for name in weights if owner[name] == file})
    if shards > 1:
        weight_map = {name: (index_says or (lambda name, file: file))(name, file) for name, file in owner.items()}
        index = files[0].split("-")[0] + files[0][files[0].rindex("."):] + ".index.json"
        (directory / index).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return owner


def _refusal(directory) -> str:
    with pytest.raises(ModelLoadError) as refused:
        check_model_dir(str(directory))
    message = str(refused.value)
    assert "\n" not in message and len(message) < 700, message
    return message


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(index=st.integers(0, 10 ** 6), dtype=st.sampled_from(STORED), container=CONTAINERS, shards=st.integers(1, 3))
def test_a_float_weight_stored_as_an_integer_type_is_refused_naming_it(index, dtype, container, shards,
                                                                       tiny_model_dir, tmp_path_factory):
    directory = _copy(tiny_model_dir, tmp_path_factory)
    weights = load_file(directory / "model.safetensors")
    name = sorted(weights)[index % len(weights)]
    weights[name] = weights[name].to(dtype)
    owner = _save_as(directory, weights, container, shards)
    message = _refusal(directory)
    assert f"{directory / owner[name]}: tensor {name!r}" in message and "quantization_config" in message, message


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(index=st.integers(0, 10 ** 6), container=CONTAINERS, shards=st.integers(2, 3),
       kind=st.sampled_from(["index names another shard", "saved in two shards"]))
def test_shards_that_disagree_with_their_index_or_each_other_are_refused_naming_both(index, container, shards, kind,
                                                                                   tiny_model_dir, tmp_path_factory):
    directory = _copy(tiny_model_dir, tmp_path_factory)
    weights = load_file(directory / "model.safetensors")
    name = sorted(weights)[index % len(weights)]
    files = _file_names(container, shards)
    other = lambda file: files[(files.index(file) + 1) % shards]  # noqa: E731 - the next shard
    if kind == "index names another shard":
        _save_as(directory, weights, container, shards,
                 index_says=lambda tensor, file: other(file) if tensor == name else file)
    else:  # a second copy, of other values, in the next shard
        owner = _save_as(directory, weights, container, shards)
        path = directory / other(owner[name])
        part = load_file(path) if container == "safetensors" else torch.load(path)
        _write(path, {**part, name: weights[name] + 1})
    message = _refusal(directory)
    assert repr(name) in message and ("index.json names" if kind[0] == "i" else "both hold") in message, message
    assert sum(file in message for file in files) == 2, message


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keep=st.integers(0, 4000))
def test_a_weight_file_whose_header_cannot_be_read_is_refused_naming_it(keep, tiny_model_dir, tmp_path_factory):
    directory = _copy(tiny_model_dir, tmp_path_factory)
    path = directory / "model.safetensors"
    path.write_bytes(path.read_bytes()[:keep])  # a truncated download
    assert f"{path} is not a safetensors file" in _refusal(directory)


def test_a_tied_config_beside_a_different_saved_head_is_refused_and_an_equal_one_loads(tiny_model_dir,
                                                                                       tmp_path_factory):
    assert json.loads((tiny_model_dir / "config.json").read_text())["tie_word_embeddings"] is True
    directory = _copy(tiny_model_dir, tmp_path_factory)
    _resave(directory, lambda w: w.__setitem__("lm_head.weight", w["model.embed_tokens.weight"].clone()))
    check_model_dir(str(directory))  # the same head saved twice: nothing to disagree
    _resave(directory, lambda w: w.__setitem__("lm_head.weight", w["lm_head.weight"] + 1))
    message = _refusal(directory)
    assert "config.json: tie_word_embeddings is true" in message and "lm_head.weight" in message, message
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    check_model_dir(str(directory))  # the saved head, untied: what the files say


def test_an_adapter_config_beside_a_whole_model_is_refused_before_the_run(tiny_model_dir, tmp_path_factory):
    directory = _copy(tiny_model_dir, tmp_path_factory)
    check_whole_model(str(directory))
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8,
                                                               "base_model_name_or_path": "/elsewhere"}))
    with pytest.raises(PreflightError) as refused:
        check_whole_model(str(directory))
    assert "adapter_config.json" in str(refused.value) and "\n" not in str(refused.value)
