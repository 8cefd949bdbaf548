"""The index of a sharded checkpoint is checked before anything loads: each defect hypothesis draws is one line
naming the index file. Before, an index without `metadata` failed inside transformers as "KeyError: 'metadata'", a
weight_map of another shape as a TypeError or AttributeError, and a shard it names that is not there only when the
weights loaded."""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.model.loading import ModelLoadError, check_model_dir

SHARD = "model-00001-of-00001.safetensors"
JUNK = st.one_of(st.none(), st.integers(), st.text(max_size=4), st.lists(st.integers(), max_size=2))
DEFECTS = {
    "no metadata": st.just({"weight_map": {"w": SHARD}}),
    "metadata of another kind": JUNK.map(lambda m: {"metadata": m, "weight_map": {"w": SHARD}}),
    "weight_map of another kind": JUNK.map(lambda w: {"metadata": {}, "weight_map": w}),
    "empty weight_map": st.just({"metadata": {}, "weight_map": {}}),
    "a shard named by a non-text": st.integers().map(lambda s: {"metadata": {}, "weight_map": {"w": s}}),
    "a missing shard": st.text(st.characters(categories=["Ll", "Nd"]), min_size=1, max_size=8).map(
        lambda name: {"metadata": {}, "weight_map": {"w": SHARD, "v": f"{name}.safetensors"}}),
}


def _sharded(tiny_model_dir, tmp_path_factory, index) -> str:
    directory = tmp_path_factory.mktemp("model") / "m"
    shutil.copytree(tiny_model_dir, directory)
    (directory / "model.safetensors").rename(directory / SHARD)
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return str(directory)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), kind=st.sampled_from(sorted(DEFECTS)))
def test_a_defective_weight_index_is_one_line_naming_it(data, kind, tiny_model_dir, tmp_path_factory):
    index = data.draw(DEFECTS[kind])
    directory = _sharded(tiny_model_dir, tmp_path_factory, index)
    with pytest.raises(ModelLoadError) as refused:
        check_model_dir(directory)
    message = str(refused.value)
    assert "\n" not in message and "model.safetensors.index.json" in message, (kind, message)


def test_a_whole_index_is_taken_and_one_beside_a_single_weights_file_is_not_read(tiny_model_dir, tmp_path_factory):
    from safetensors import safe_open

    directory = _sharded(tiny_model_dir, tmp_path_factory, {})
    with safe_open(f"{directory}/{SHARD}", "pt") as weights:
        names = list(weights.keys())
    index = {"metadata": {"total_size": 1}, "weight_map": {name: SHARD for name in names}}
    with open(f"{directory}/model.safetensors.index.json", "w") as file:
        json.dump(index, file)
    check_model_dir(directory)
    beside = _sharded(tiny_model_dir, tmp_path_factory, {"weight_map": 5})
    shutil.copy(f"{beside}/{SHARD}", f"{beside}/model.safetensors")  # transformers reads this one, not the index
    check_model_dir(beside)
