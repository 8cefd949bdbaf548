"""A model directory whose files are damaged or replaced is refused, before any weight loads, in one line naming
the file (hypothesis draws the file and the damage): a file the loaders open that is a directory or a dangling
link (a `tokenizer.json` directory was skipped silently: every prompt then "empty after tokenization"), a config
file that is not JSON, not an object, or holds NaN / Infinity (Python's json reads them: `rms_norm_eps: NaN`
generated NaN), a config.json transformers refuses (a negative layer count raised a multi-line error of no type the
CLI names). A chat template that cannot render, or refuses the messages, is named by the data row; weights that
hold NaN are named by tensor."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.config import ModelConfig
from grpo_engine.data.prompts import DataError, render_prompts
from grpo_engine.model.loading import ModelLoadError, check_model_dir, load_causal_lm, load_tokenizer

FILES = ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja",
         "model.safetensors"]
CONFIG_FILES = ["config.json", "tokenizer_config.json", "generation_config.json"]
CONFIG_EDITS = {  # config.json's key -> a value transformers refuses
    "num_hidden_layers": -1, "model_type": "no_such_architecture", "layer_types": "full_attention",
}


@st.composite
def damages(draw):
    how = draw(st.sampled_from(["directory", "dangling link", "not json", "not an object", "non-finite",
                                "refused setting", "fine"]))
    name = draw(st.sampled_from(FILES if how in ("directory", "dangling link") else CONFIG_FILES))
    if how == "refused setting":
        name = "config.json"
    return how, name, draw(st.sampled_from(["NaN", "Infinity", "-Infinity"])), draw(st.sampled_from(sorted(CONFIG_EDITS)))


def _damage(directory, how, name, literal, key) -> None:
    path = directory / name
    if how == "directory":
        path.unlink()
        path.mkdir()
    elif how == "dangling link":
        path.unlink()
        path.symlink_to(directory / "gone")
    elif how == "not json":
        path.write_text(path.read_text()[:-3])
    elif how == "not an object":
        path.write_text(json.dumps([json.loads(path.read_text())]))
    elif how == "non-finite":
        path.write_text(path.read_text().replace("{", '{"some_scale": ' + literal + ", ", 1))
    elif how == "refused setting":
        settings_ = json.loads(path.read_text())
        settings_[key] = CONFIG_EDITS[key]
        path.write_text(json.dumps(settings_))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damage=damages())
def test_a_damaged_model_file_is_one_line_naming_it_before_any_weight_loads(damage, tiny_model_dir, tmp_path_factory):
    directory = tmp_path_factory.mktemp("model") / "m"
    shutil.copytree(tiny_model_dir, directory)
    how, name, literal, key = damage
    _damage(directory, how, name, literal, key)
    if how == "fine":
        check_model_dir(str(directory))
        return
    with pytest.raises(ModelLoadError) as refused:
        load_tokenizer(str(directory))  # what train's preflight and eval do first: no weights
    message = str(refused.value)
    assert "\n" not in message and len(message) < 600 and str(directory) in message, message
    assert name in message or how == "refused setting" and "config.json" in message, message


TEMPLATES = st.sampled_from([
    "{% for m in messages %}{{ m.content ",  # a syntax error
    "{{ raise_exception('System role not supported') }}",  # Gemma's refusal of a system message
    "{% for m in messages %}{{ m.content.missing_method() }}{% endfor %}",  # fails while rendering
    "{{ messages[7].content }}",
])


@settings(max_examples=12, deadline=None)
@given(template=TEMPLATES, rows=st.integers(1, 3), system=st.sampled_from([None, "be brief"]))
def test_a_chat_template_that_cannot_render_is_named_by_its_row(template, rows, system):
    from grpo_engine.data.demo_task import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = template
    data = [{"prompt": [{"role": "user", "content": f"{i}+1="}]} for i in range(rows)]
    with pytest.raises(DataError) as refused:
        render_prompts(data, "prompt", tokenizer, system, "dataset 'd.jsonl'")
    message = str(refused.value)
    assert message.startswith("dataset 'd.jsonl' row 0: the model's chat template") and "\n" not in message


def test_weights_holding_nan_are_named_when_the_model_loads(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    directory = tmp_path / "m"
    shutil.copytree(tiny_model_dir, directory)
    weights = load_file(directory / "model.safetensors")
    name = sorted(weights)[-1]
    weights[name] = weights[name].clone().fill_(float("inf"))
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="holds NaN or inf in"):
        load_causal_lm(str(directory), ModelConfig(), torch.device("cpu"))
    (directory / "model.safetensors").write_bytes(b"\x08" * 100)  # a damaged file: safetensors' own error type
    with pytest.raises(ModelLoadError, match="SafetensorError"):
        load_causal_lm(str(directory), ModelConfig(), torch.device("cpu"))
