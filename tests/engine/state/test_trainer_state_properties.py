"""A checkpoint's trainer_state.json edited by hand, with its manifest rewritten to match (so no checksum catches
it), or written by another version: the checkpoint is intact only when the file holds what the engine writes, else
it is named damaged in one line naming the field, before anything loads, and `latest` falls back (hypothesis).
Before its schema, a missing sampler failed after the model loaded with a KeyError, and `"offset": -5` or
`"num_tokens": [1]` resumed from another position or crashed in int()."""

from __future__ import annotations

import copy
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.data.prompts import DataError, PromptSampler
from grpo_engine.state import checkpoint as ckpt

VALID = {"sampler": {"epoch": 1, "offset": 3}, "num_tokens": 256,
         "data": {"train": {"source": "'d.jsonl'", "rows": 9, "sha256": "ab" * 32}}, "step": 2}
PATHS = [("step",), ("sampler",), ("sampler", "epoch"), ("sampler", "offset"), ("num_tokens",), ("data",),
         ("data", "train"), ("data", "train", "rows"), ("data", "train", "sha256"), ("data", "train", "source")]
WRONG = st.one_of(st.none(), st.booleans(), st.floats(), st.text(max_size=4), st.integers(-10**30, -1),
                  st.integers(10**30, 10**40), st.lists(st.integers(), max_size=2),
                  st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _accepted(path: tuple[str, ...], value) -> bool:
    """Whether the engine writes `value` at `path` (an independent statement of the schema)."""
    name = path[-1]
    if name in ("step", "epoch", "offset", "num_tokens", "rows"):
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0 and (
            name != "step" or value == 2)  # the directory's name says step 2
    if name == "sha256":
        return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    if name == "source":
        return isinstance(value, str)
    if name == "data":
        return value is None or (isinstance(value, dict) and not value)  # {} holds no fingerprint: fine
    return False  # the sampler, a fingerprint: objects the engine writes whole


@st.composite
def edits(draw):
    path = draw(st.sampled_from(PATHS))
    how = draw(st.sampled_from(["set", "delete", "extra"]))
    return path, how, draw(WRONG)


def _write(tmp_path, state) -> "ckpt.Path":
    path = tmp_path / "checkpoints" / "checkpoint-000002"
    path.mkdir(parents=True, exist_ok=True)
    (path / ckpt.STATE_FILE).write_text(json.dumps(state))
    (path / ckpt.MANIFEST_FILE).unlink(missing_ok=True)
    ckpt.write_manifest(path)  # the manifest rewritten by hand to match: no checksum catches the edit
    return path


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edit=edits())
def test_a_hand_edited_trainer_state_is_intact_only_as_the_engine_writes_it(edit, tmp_path):
    path, how, value = edit
    state = copy.deepcopy(VALID)
    parent = state
    for key in path[:-1]:
        parent = parent[key]
    if how == "set":
        parent[path[-1]] = value
        accepted = _accepted(path, value)
    elif how == "delete":
        del parent[path[-1]]
        # Absent in checkpoints older than them; a run without its training fingerprint is not compared.
        accepted = path in (("num_tokens",), ("data",), ("data", "train"))
    else:
        parent["added_by_hand"] = value  # in data, a role whose value is no fingerprint; elsewhere no field at all
        accepted = False
    point = _write(tmp_path, state)
    problems = ckpt.checkpoint_problems(point)
    if accepted:
        assert problems == [], problems
        return
    assert len(problems) == 1 and ckpt.STATE_FILE in problems[0] and "\n" not in problems[0], problems
    assert len(problems[0]) < 300, problems
    with pytest.raises(ckpt.CheckpointError, match="no intact checkpoint"):
        ckpt.resolve_resume("latest", tmp_path)


@pytest.mark.parametrize("state", [{"epoch": 0, "offset": 9}, {"epoch": 0, "offset": 10**6}, {"epoch": -1, "offset": 0},
                                   {"epoch": 0, "offset": -5}])
def test_a_saved_prompt_position_outside_the_rows_is_refused(state):
    sampler = PromptSampler(9, seed=0)
    with pytest.raises(DataError, match=r"saved prompt position .* is not one in the 9 rows"):
        sampler.load_state_dict(state)
    sampler.load_state_dict({"epoch": 3, "offset": 8})
    assert (sampler.epoch, sampler.offset) == (3, 8)


def test_a_state_of_another_shape_is_one_line_naming_its_file(tmp_path):
    import torch

    scheduler = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0),
                                                  lambda step: 1.0)
    with pytest.raises(ckpt.CheckpointError) as refused:
        with ckpt.restoring(tmp_path / "scheduler.pt"):
            scheduler.load_state_dict({"x": 1})
    message = str(refused.value)
    assert "scheduler.pt" in message and "\n" not in message and not math.isnan(len(message))


SECTIONS = st.sampled_from(["model", "data", "run", "optim"])
YAML_VALUES = st.one_of(st.integers(), st.text(max_size=5), st.none(), st.lists(st.integers(), max_size=2))


@settings(max_examples=40, deadline=None)
@given(tree=st.one_of(YAML_VALUES, st.dictionaries(SECTIONS, st.one_of(YAML_VALUES, st.dictionaries(
    st.sampled_from(["seed", "x"]), st.integers(0, 9), max_size=2)), min_size=1, max_size=3)))
def test_a_saved_config_that_is_not_a_mapping_of_sections_is_one_line_naming_it(tree):
    import yaml

    from grpo_engine.config import load_config
    from grpo_engine.state.resume import changed_options

    text = yaml.safe_dump(tree)
    config = load_config(overrides={"run.output_dir": "r"})
    try:
        changed = changed_options(text, config, "ckpt/config.yaml")
    except ckpt.CheckpointError as exc:
        assert "ckpt/config.yaml" in str(exc) and "\n" not in str(exc)
        # a mapping of sections is refused only for holding other settings than this engine's (saved_settings.py)
        assert not (isinstance(tree, dict) and all(isinstance(v, dict) for v in tree.values())) or \
            "another version of the engine saved it" in str(exc)
        return
    assert isinstance(changed, dict) and isinstance(tree, dict)
