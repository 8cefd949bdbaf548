"""Property test of the values config.json holds for the decoder (grpo_engine.model.config_values): a value of any
type written to a size, epsilon, dropout, base, activation, boolean or dtype key is accepted when it is of the key's
type and range and consistent with the head counts, or refused before any weight loads by one line naming the file
and the key. Before, `max_position_embeddings` 0, `rms_norm_eps` 1e308 (every output the same) or negative,
`attention_dropout` 5, `initializer_range` -0.02 and `torch_dtype` "bogus" loaded silently, and zero / negative /
non-dividing head counts and sizes failed at the load in words naming nothing ("ZeroDivisionError",
"You set `ignore_mismatched_sizes` to `False`", "negative dimension"), a `rope_theta` of 0 as NaN weights."""

from __future__ import annotations

import json
import math
import os
import shutil

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers.activations import ACT2FN

from grpo_engine.config import ModelConfig
from grpo_engine.model.limits import ModelFitError
from grpo_engine.model.loading import check_model_dir, load_causal_lm
from model_variants import check_taken_or_refused

FLOAT32_MAX = 3.4028234663852886e38  # the schema's bound of every number

DERANDOMIZE = bool(os.environ.get("CI"))
HEADS, KV_HEADS, HIDDEN = 4, 2, 64  # the tiny model's (tests/engine/conftest.py tiny_model_dir)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) <= FLOAT32_MAX


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _size(v) -> bool:
    return _whole(v) and v >= 1


# key -> whether a value is one the model can be built with and run right (the other keys as the tiny model has
# them: 4 attention heads, 2 key/value heads, hidden size 64, rotary embeddings)
KEYS = {
    "vocab_size": lambda v: _whole(v) and v >= 2,  # above the token ids config.json names (0 and 1)
    "intermediate_size": _size, "num_hidden_layers": _size, "max_position_embeddings": _size,
    "sliding_window": _size, "max_window_layers": lambda v: _whole(v) and v >= 0,
    "num_attention_heads": lambda v: _size(v) and v % KV_HEADS == 0 and HIDDEN % v == 0 and HIDDEN // v % 2 == 0,
    "num_key_value_heads": lambda v: _size(v) and HEADS % v == 0,
    "hidden_size": lambda v: _size(v) and v % HEADS == 0 and v // HEADS % 2 == 0,
    "head_dim": lambda v: _size(v) and v % 2 == 0,
    "rms_norm_eps": lambda v: _number(v) and 0 < v < 1, "attention_dropout": lambda v: _number(v) and 0 <= v < 1,
    "initializer_range": lambda v: _number(v) and v >= 0, "rope_theta": lambda v: _number(v) and v > 0,
    "hidden_act": lambda v: isinstance(v, str) and v in ACT2FN,
    "tie_word_embeddings": lambda v: isinstance(v, bool), "use_cache": lambda v: isinstance(v, bool),
    "use_sliding_window": lambda v: isinstance(v, bool),
    "dtype": lambda v: v == "auto" or isinstance(v, str) and isinstance(getattr(torch, v, None), torch.dtype),
    "torch_dtype": lambda v: v == "auto" or isinstance(v, str) and isinstance(getattr(torch, v, None), torch.dtype),
}

VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 8), st.sampled_from([16, 32, 64, 63, 128, 2**40]),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0.0, 1e-6, 0.5, 1.0, 1e308, -1e-6, 10000.0]),
    st.text(max_size=5), st.sampled_from(["silu", "gelu", "no_such_act", "false", "true", "float32", "bogus", "1e-6"]),
    st.just([1]), st.just({"a": 1}))


@settings(max_examples=60, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(key=st.sampled_from(sorted(KEYS)), value=VALUES)
def test_a_config_value_of_any_kind_is_taken_in_its_range_or_refused_naming_file_and_key(
        key, value, tiny_model_dir, tmp_path_factory):
    directory = tmp_path_factory.mktemp("model")
    shutil.copytree(tiny_model_dir, directory, dirs_exist_ok=True)
    valid = value is None or KEYS[key](value)
    path = directory / "config.json"
    config = json.loads(path.read_text())
    if key == "rope_theta":  # transformers >= 5 writes it inside rope_parameters; older configs at the top
        config["rope_parameters"]["rope_theta"] = value
    else:
        config[key] = value
    path.write_text(json.dumps(config))
    check_taken_or_refused(directory, "config.json", key, value, valid)


@settings(max_examples=4, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(key_value=st.sampled_from([("intermediate_size", 100), ("head_dim", 8), ("vocab_size", 120),
                                  ("num_key_value_heads", 4), ("hidden_size", 128)]))
def test_sizes_in_range_but_not_the_weights_are_one_line_naming_config_json(key_value, tiny_model_dir,
                                                                            tmp_path_factory):
    """Sizes of their type and range that the saved weights do not have: taken by the checks of config.json alone,
    refused at the load in one line (before: "You set `ignore_mismatched_sizes` to `False`, thus raising an error.
    For details look at the above report!", a report transformers' verbosity had switched off)."""
    key, value = key_value
    directory = tmp_path_factory.mktemp("model")
    shutil.copytree(tiny_model_dir, directory, dirs_exist_ok=True)
    config = json.loads((directory / "config.json").read_text())
    config[key] = value
    (directory / "config.json").write_text(json.dumps(config))
    check_model_dir(str(directory))
    with pytest.raises(ModelFitError) as refused:
        load_causal_lm(str(directory), ModelConfig(), torch.device("cpu"))
    message = str(refused.value)
    assert "\n" not in message and "config.json" in message and "of another shape" in message, message
