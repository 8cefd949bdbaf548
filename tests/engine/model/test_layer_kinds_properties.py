"""Property test of config.json's layer kinds (`layer_types`) against the settings their attention reads: every
combination of layer kinds, `use_sliding_window`, `sliding_window` and `max_window_layers` is either refused before
any weight loads, in one line naming config.json and `layer_types`, or loads and generates with its key/value cache.
Before, a "sliding_attention" layer whose window the configuration left unset (sliding_window null, or Qwen2's
use_sliding_window false, which drops the window) passed every check and failed at the first forward deep in
transformers' cache: "TypeError: 'NoneType' object cannot be interpreted as an integer", 55 lines of traceback."""

from __future__ import annotations

import json
import os
import shutil

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_engine.config import ModelConfig
from grpo_engine.model.loading import ModelLoadError, check_model_dir, load_causal_lm

DERANDOMIZE = bool(os.environ.get("CI"))
LAYERS = 2  # the tiny model's (tests/engine/conftest.py tiny_model_dir)
ABSENT = object()  # the key left out of config.json: transformers' default applies


@st.composite
def layer_settings(draw) -> dict:
    values = {"layer_types": draw(st.none() | st.lists(st.sampled_from(["full_attention", "sliding_attention"]),
                                                       min_size=LAYERS, max_size=LAYERS)),
              "use_sliding_window": draw(st.sampled_from([ABSENT, True, False])),
              "sliding_window": draw(st.sampled_from([ABSENT, None]) | st.integers(1, 64)),
              "max_window_layers": draw(st.sampled_from([ABSENT]) | st.integers(0, LAYERS))}
    return {key: value for key, value in values.items() if value is not ABSENT}


@settings(max_examples=25, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(changes=layer_settings())
def test_layer_kinds_are_refused_naming_config_json_or_generate(changes, tiny_model_dir, tmp_path_factory):
    directory = tmp_path_factory.mktemp("model")
    shutil.copytree(tiny_model_dir, directory, dirs_exist_ok=True)
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key in ("layer_types", "use_sliding_window", "sliding_window", "max_window_layers"):
        config.pop(key, None)
    path.write_text(json.dumps({**config, **changes}))
    try:
        check_model_dir(str(directory))
    except ModelLoadError as exc:
        message = str(exc)
        assert "\n" not in message and "config.json" in message and "layer_types" in message, (changes, message)
        return
    model = load_causal_lm(str(directory), ModelConfig(), torch.device("cpu"))
    with torch.no_grad():  # the key/value cache each layer kind builds: where the unset window failed
        out = model.generate(torch.tensor([[3, 4, 5]]), max_new_tokens=2, do_sample=False, use_cache=True,
                             pad_token_id=0)
    assert out.shape == (1, 5), changes
