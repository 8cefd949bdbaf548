"""tokenizer_config.json's values the tokenizer compares or branches on are typed before anything loads: one line
naming the file and the key. Before, `"model_max_length": "x"` was a TypeError traceback at the first prompt,
-1 / 0 / true a warning at every prompt ("longer than the specified maximum sequence length"), and a bad padding or
truncation side transformers' refusal in its words."""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.model.loading import ModelLoadError, load_tokenizer

BAD = {
    "model_max_length": st.one_of(st.integers(max_value=0), st.text(max_size=5), st.booleans(),
                                  st.floats(max_value=0.99, allow_nan=False, allow_infinity=False),
                                  st.lists(st.integers(1, 9), max_size=2)),
    "padding_side": st.one_of(st.none(), st.integers(), st.sampled_from(["Left", "RIGHT", " left", "center"]),
                              st.text(max_size=6).filter(lambda side: side not in ("left", "right"))),
    "truncation_side": st.one_of(st.none(), st.integers(), st.sampled_from(["both", "Left", "", "right "])),
}
GOOD = {
    "model_max_length": st.one_of(st.none(), st.integers(1, 2**100), st.just(1000000000000000019884624838656)),
    "padding_side": st.sampled_from(["left", "right"]),
    "truncation_side": st.sampled_from(["left", "right"]),
}


@st.composite
def edits(draw):
    key = draw(st.sampled_from(sorted(BAD)))
    good = draw(st.booleans())
    return key, good, draw((GOOD if good else BAD)[key])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edit=edits())
def test_a_tokenizer_setting_of_the_wrong_kind_is_one_line_naming_the_file_and_key(edit, tiny_model_dir,
                                                                                   tmp_path_factory):
    key, good, value = edit
    directory = tmp_path_factory.mktemp("model") / "m"
    shutil.copytree(tiny_model_dir, directory)
    path = directory / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    if good:
        tokenizer = load_tokenizer(str(directory))
        assert tokenizer(["1+2="])["input_ids"][0]
        return
    with pytest.raises(ModelLoadError) as refused:
        load_tokenizer(str(directory))
    message = str(refused.value)
    assert "\n" not in message and f"{path}: {key}: " in message, message
