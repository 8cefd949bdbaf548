"""The tokenizer the engine loads is the one its files describe (tokenizer_files.py), drawn by hypothesis:

- files naming the generic class encode any text as tokenizer.json does (before: config.json's model type's class,
  Qwen2's byte-level BPE, dropped every space and newline of the demo's saved character tokenizer);
- roles the files leave unset get no token the files lack (before: Qwen2's `<|endoftext|>` was added past the
  model's vocabulary), the pad falls back to an EOS, and no EOS anywhere is one line;
- a special token that ordinary text encodes to is one line naming it (before: decoding dropped it from every
  completion the reward functions scored), and so is a model EOS id that is (every completion ended at it);
- a tiny model_max_length no longer warns "will result in indexing errors" (the engine bounds prompts itself).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from tokenizers import Tokenizer

from grpo_engine.model.loading import ModelLoadError, load_tokenizer

# The built-in character tokenizer's characters: printable ASCII and a newline.
ALPHABET = [chr(code) for code in range(32, 127)] + ["\n"]
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
ROLES = ("pad_token", "eos_token", "bos_token", "unk_token")


def _copy(saved: Path, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("model") / "m"
    shutil.copytree(saved, directory)
    return directory


def _edit(path: Path, **values) -> None:
    settings_ = json.loads(path.read_text()) if path.exists() else {}
    for key, value in values.items():
        if value is None:
            settings_.pop(key, None)
        else:
            settings_[key] = value
    path.write_text(json.dumps(settings_))


@SETTINGS
@given(text=st.text(st.sampled_from(ALPHABET), min_size=1, max_size=40))
def test_a_tokenizer_of_the_generic_class_encodes_as_its_tokenizer_json(text, tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    saved = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == saved.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


@SETTINGS
@given(unset=st.sets(st.sampled_from(ROLES)), model_eos=st.booleans(),
       tokenizer_class=st.sampled_from(["TokenizersBackend", "PreTrainedTokenizerFast", "Qwen2Tokenizer"]))
def test_roles_the_files_leave_unset_add_no_token_and_the_pad_falls_back_to_an_eos(unset, model_eos, tokenizer_class,
                                                                                 tiny_model_dir, tmp_path_factory):
    directory = _copy(tiny_model_dir, tmp_path_factory)
    _edit(directory / "tokenizer_config.json", tokenizer_class=tokenizer_class, **{role: None for role in unset})
    if not model_eos:
        for name in ("config.json", "generation_config.json"):
            _edit(directory / name, eos_token_id=None)
    if "eos_token" in unset and not model_eos:
        with pytest.raises(ModelLoadError) as refused:
            load_tokenizer(str(directory))
        assert "\n" not in str(refused.value) and "names no EOS token" in str(refused.value)
        return
    tokenizer = load_tokenizer(str(directory))
    assert len(tokenizer) == 99, [tokenizer.convert_ids_to_tokens(i) for i in range(99, len(tokenizer))]
    assert tokenizer.pad_token in ("<pad>", "<eos>")
    assert tokenizer.pad_token == "<pad>" or "pad_token" in unset


@SETTINGS
@given(role=st.sampled_from(["pad_token", "eos_token", "bos_token", "generation_config.json's eos_token_id"]),
       token=st.sampled_from(ALPHABET))
def test_a_special_token_or_eos_id_that_is_ordinary_text_is_one_line_naming_it(role, token, tiny_model_dir,
                                                                               tmp_path_factory):
    directory = _copy(tiny_model_dir, tmp_path_factory)
    if role.startswith("generation_config"):  # an EOS id from another model's vocabulary: a character here
        token_id = Tokenizer.from_file(str(directory / "tokenizer.json")).token_to_id(token)
        _edit(directory / "generation_config.json", eos_token_id=[1, token_id])
        named = f"{role} (id {token_id})"
    else:
        _edit(directory / "tokenizer_config.json", **{role: token})
        named = f"{role} {token!r}"
    with pytest.raises(ModelLoadError) as refused:
        load_tokenizer(str(directory))
    message = str(refused.value)
    assert "\n" not in message and named in message and "is ordinary text" in message, message


def test_a_tiny_model_max_length_does_not_warn_of_indexing_errors(tiny_model_dir, tmp_path_factory):
    """transformers warns when an encoding is longer than model_max_length (through its own logger, which the tests'
    settings may silence): the limit is lifted, so the warning cannot come."""
    directory = _copy(tiny_model_dir, tmp_path_factory)
    _edit(directory / "tokenizer_config.json", model_max_length=8)
    tokenizer = load_tokenizer(str(directory))
    ids = tokenizer(["1+2=" * 10], add_special_tokens=False)["input_ids"][0]
    assert len(ids) == 40 and len(ids) <= tokenizer.model_max_length
