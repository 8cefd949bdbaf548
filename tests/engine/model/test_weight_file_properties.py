"""The weight files a model directory holds, checked from their safetensors headers before any weight loads, one line
naming the file and tensor (hypothesis draws the tensor and the stored type): a float weight stored as an integer or
bool type with no quantization_config (transformers cast it silently), a header that is not one (a truncated
download failed after the run directory was written), config.json's tie_word_embeddings true beside a saved head
that differs from the embeddings; and a stray adapter_config.json beside a whole model, refused by train's preflight."""

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


def _copy(tiny_model_dir, tmp_path_factory):
    directory = tmp_path_factory.mktemp("model") / "m"
    shutil.copytree(tiny_model_dir, directory)
    return directory


def _resave(directory, edit) -> None:
    weights = load_file(directory / "model.safetensors")
    edit(weights)
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})


def _refusal(directory) -> str:
    with pytest.raises(ModelLoadError) as refused:
        check_model_dir(str(directory))
    message = str(refused.value)
    assert "\n" not in message and len(message) < 700, message
    return message


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(index=st.integers(0, 10 ** 6), dtype=st.sampled_from(STORED))
def test_a_float_weight_stored_as_an_integer_type_is_refused_naming_it(index, dtype, tiny_model_dir,
                                                                       tmp_path_factory):
    directory = _copy(tiny_model_dir, tmp_path_factory)
    names = sorted(load_file(directory / "model.safetensors"))
    name = names[index % len(names)]
    _resave(directory, lambda weights: weights.__setitem__(name, weights[name].to(dtype)))
    message = _refusal(directory)
    assert repr(name) in message and "model.safetensors" in message and "quantization_config" in message, message


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
