"""Property test of the generation settings a model directory holds: a value of any type written to a setting of
generation_config.json, or to a special token id of config.json, is accepted when it is of the setting's type and
range (every token id inside config.json's vocabulary), or refused before any weight loads by one line naming the
file and the key. Before, `"eos_token_id": "a"` failed in a tensor constructor naming nothing, `"top_k": "x"` with a
traceback inside generate, and an EOS id past the vocabulary was taken silently (no completion could end)."""

from __future__ import annotations

import json
import math
import os
import shutil

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from model_variants import check_taken_or_refused

DERANDOMIZE = bool(os.environ.get("CI"))
TOKEN_IDS = ["bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"]


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ids(vocab):
    def valid(value) -> bool:
        ids = value if isinstance(value, list) and value else [value]
        return value is None or all(_whole(token) and 0 <= token < vocab for token in ids)
    return valid


# each declared setting of generation_config.json and the values it takes (None: unset), by transformers' meaning
GENERATION = {
    "do_sample": lambda v: isinstance(v, bool), "use_cache": lambda v: isinstance(v, bool),
    "temperature": lambda v: _number(v) and v >= 0, "top_k": lambda v: _whole(v) and v >= 0,
    "top_p": lambda v: _number(v) and 0 <= v <= 1, "min_p": lambda v: _number(v) and 0 <= v <= 1,
    "typical_p": lambda v: _number(v) and 0 <= v <= 1, "repetition_penalty": lambda v: _number(v) and v > 0,
    "length_penalty": _number, "max_length": lambda v: _whole(v) and v >= 1,
    "max_new_tokens": lambda v: _whole(v) and v >= 1, "min_length": lambda v: _whole(v) and v >= 0,
    "min_new_tokens": lambda v: _whole(v) and v >= 0, "num_beams": lambda v: _whole(v) and v >= 1,
    "num_return_sequences": lambda v: _whole(v) and v >= 1, "no_repeat_ngram_size": lambda v: _whole(v) and v >= 0,
}

VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.integers(90, 110), st.integers(-2**63, 2**63),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0.0, 0.5, 1.0, 1.5, -0.0]),
    st.text(max_size=5), st.sampled_from(["1", "0.7", "true", ""]),
    st.lists(st.integers(-2, 120), max_size=3), st.just({"a": 1}), st.just([[1]]))


@settings(max_examples=80, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(file=st.sampled_from(["generation_config.json", "config.json"]), data=st.data())
def test_a_generation_setting_of_any_value_is_taken_in_its_range_or_refused_naming_file_and_key(
        file, data, tiny_model_dir, tmp_path_factory):
    directory = tmp_path_factory.mktemp("model")
    shutil.copytree(tiny_model_dir, directory, dirs_exist_ok=True)
    vocab = json.loads((directory / "config.json").read_text())["vocab_size"]
    keys = TOKEN_IDS + (sorted(GENERATION) if file == "generation_config.json" else [])
    key, value = data.draw(st.sampled_from(keys)), data.draw(VALUES)
    valid = _ids(vocab)(value) if key in TOKEN_IDS else value is None or GENERATION[key](value)
    path = directory / file
    settings_ = json.loads(path.read_text())
    settings_[key] = value
    path.write_text(json.dumps(settings_))
    check_taken_or_refused(directory, file, key, value, valid)
