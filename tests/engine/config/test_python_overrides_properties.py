"""load_config and a loaded config used from Python (a notebook, a script): overrides holding Python values (a Path,
numpy and torch scalars, a tuple, a one-dimensional array) and sections given as mappings load what the plain
dotted values load; overrides that are not a mapping of text keys, and a setting given twice with two values, are
one line naming `overrides`; a key set after load is checked as a load checks it, in the same one line.

Before: np.int64 was "expected an integer, got np.int64(2)", a Path or tuple was refused, `{("run", "max_steps"):
2}` and `["run.max_steps=2"]` stopped in an AttributeError naming nothing, `{"run.seed": 5, "run": {...}}` dropped
the seed (and the YAML file's run keys) without a word, and `config.run.max_steps = -3` was pydantic's five lines.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_engine.config import ConfigError, leaf_fields, load_config

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Keys of each kind of value, with valid values (a rule across keys cannot refuse any combination of them).
VALID = {
    "run.max_steps": st.integers(1, 10_000),
    "run.seed": st.integers(0, 2**32 - 1),
    "run.save_steps": st.integers(0, 1000),
    "rollout.num_generations": st.integers(2, 64),
    "model.lora.r": st.integers(1, 64),
    "optim.learning_rate": st.floats(1e-8, 1.0),
    "rollout.temperature": st.floats(0.1, 2.0),
    "run.plot": st.booleans(),
    "run.progress_bar": st.booleans(),
    "run.output_dir": st.from_regex(r"\A[a-z]{1,8}(/[a-z]{1,8})?\Z"),
    "rewards.functions": st.lists(st.sampled_from(["math_accuracy", "format"]), min_size=1, max_size=2, unique=True),
}


def _dresses(value: Any) -> st.SearchStrategy:
    """The same value as a Python caller may hold it."""
    if isinstance(value, bool):
        kinds = [bool, np.bool_, torch.tensor]
    elif isinstance(value, int):
        kinds = [int, np.int64, np.uint64, lambda v: torch.tensor(v, dtype=torch.int64)]
    elif isinstance(value, float):
        kinds = [float, np.float64, lambda v: torch.tensor(v, dtype=torch.float64)]
    elif isinstance(value, str):
        kinds = [str, Path, PurePosixPath]
    else:
        kinds = [list, tuple, np.array]
    return st.sampled_from(kinds).map(lambda dress: dress(value))


@st.composite
def settings_and_dressed(draw) -> tuple[dict[str, Any], dict[str, Any]]:
    """(plain dotted overrides, the same settings dressed and partly given as nested sections)."""
    keys = draw(st.lists(st.sampled_from(sorted(VALID)), min_size=1, max_size=6, unique=True))
    plain = {key: draw(VALID[key]) for key in keys}
    dressed: dict[str, Any] = {}
    for key, value in plain.items():
        worn = draw(_dresses(value))
        parts = key.split(".")
        depth = draw(st.integers(0, len(parts) - 1))  # how many of the key's parts are a section's mapping
        if depth == 0:
            dressed[key] = worn
            continue
        outer = ".".join(parts[:len(parts) - depth])
        node = dressed.setdefault(outer, {})
        if not isinstance(node, dict):
            dressed[key] = worn
            continue
        for part in parts[len(parts) - depth:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = worn
    return plain, dressed


def _config_file(tmp_path_factory) -> Path:
    """A YAML file setting keys beside the drawn ones: a section given as a mapping must keep them."""
    path = tmp_path_factory.mktemp("yaml") / "config.yaml"
    path.write_text("run:\n  eval_steps: 7\n  num_threads: 1\nmodel:\n  lora:\n    alpha: 5\n")
    return path


@SETTINGS
@given(drawn=settings_and_dressed(), from_file=st.booleans())
def test_python_values_and_nested_sections_load_what_the_plain_dotted_keys_load(drawn, from_file, tmp_path_factory):
    plain, dressed = drawn
    path = _config_file(tmp_path_factory) if from_file else None
    expected = load_config(path, plain)
    assert load_config(path, dressed) == expected
    if from_file:
        assert (expected.run.eval_steps, expected.run.num_threads, expected.model.lora.alpha) == (7, 1, 5)
    assert load_config(Path(path) if path else None, dressed) == expected  # a Path to the file too


@SETTINGS
@given(key=st.sampled_from(sorted(VALID)), data=st.data())
def test_a_setting_given_both_dotted_and_nested_with_two_values_is_refused_naming_it(key, data):
    first, second = data.draw(VALID[key]), data.draw(VALID[key])
    section, leaf = key.rsplit(".", 1)
    overrides = {key: first, section: {leaf: second}}
    if first == second:
        assert load_config(overrides=overrides) == load_config(overrides={key: first})
        return
    with pytest.raises(ConfigError) as refused:
        load_config(overrides=overrides)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"overrides: {key} given twice"), message


NOT_TEXT = st.one_of(st.integers(), st.tuples(st.text(max_size=3)), st.none(), st.binary(min_size=1, max_size=4),
                     st.floats(allow_nan=False), st.frozensets(st.integers(), max_size=2))
NOT_A_MAPPING = st.one_of(st.lists(st.text(max_size=12), max_size=3), st.text(min_size=1, max_size=12),
                          st.integers(), st.tuples(st.text(max_size=3), st.integers()), st.sets(st.integers(), max_size=2))


@SETTINGS
@given(overrides=st.one_of(
    NOT_A_MAPPING,
    st.dictionaries(NOT_TEXT, st.integers(), min_size=1, max_size=2),
    st.builds(lambda section, key: {section: {key: 1}}, st.sampled_from(["run", "model", "optim"]), NOT_TEXT)))
def test_overrides_that_are_not_a_mapping_of_text_keys_are_one_line(overrides):
    with pytest.raises(ConfigError) as refused:
        load_config(overrides=overrides)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("overrides: expected "), message


FIELDS = leaf_fields()
ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(), st.text(max_size=8),
                      st.lists(st.integers(-3, 3), max_size=2), st.just(Path("p")), st.just(np.int64(3)))


def _section_and_leaf(config, key: str):
    *parents, leaf = key.split(".")
    for part in parents:
        config = getattr(config, part)
    return config, leaf


@SETTINGS
@given(key=st.sampled_from(sorted(FIELDS)), value=ANY_VALUE)
def test_a_key_set_after_load_is_taken_or_refused_in_one_line_naming_it(key, value):
    config = load_config()
    section, leaf = _section_and_leaf(config, key)
    before = section.model_dump()
    try:
        setattr(section, leaf, value)
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message and (key in message or leaf in message), (key, value, message)
        assert section.model_dump() == before  # nothing half-set
        return
    try:
        loaded = load_config(overrides={key: value})
    except ConfigError:
        return  # a rule across sections, which train() checks again (tests/engine/test_host_circumstances.py)
    assert getattr(section, leaf) == getattr(_section_and_leaf(loaded, key)[0], leaf)


@given(key=st.from_regex(r"\A[a-z]{1,10}\Z"), section=st.sampled_from(["run", "model.lora", "optim", "rollout.server"]))
@settings(max_examples=40, deadline=None)
def test_a_key_unknown_to_a_section_set_after_load_is_one_line_naming_it(key, section):
    config = load_config()
    target, _ = _section_and_leaf(config, f"{section}.x")
    if key in type(target).model_fields:
        return
    with pytest.raises(ConfigError) as refused:
        setattr(target, key, 1)
    assert str(refused.value).startswith(f"unknown key '{section}.{key}'"), str(refused.value)


@pytest.mark.parametrize("path", [b"/nonexistent/config.yaml", 3, 2.5, ["config.yaml"]])
def test_the_config_path_is_text_a_path_or_bytes(path):
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("config file"), message
