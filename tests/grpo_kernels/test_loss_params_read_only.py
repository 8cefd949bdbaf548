"""GRPOLossConfig.loss_params cannot change once the config is built: every way of changing a dict in place
(item assignment and deletion, update, |=, pop, popitem, setdefault, clear) raises TypeError in one line saying how
to make another config, and the config's hash and equality stay those it was built with. Before, a mutation after
the config was hashed left it in a set under its old hash (found by neither `in` nor a cache), and the loss read
values its saved config did not hold. It is still a dict: asdict, JSON, YAML, pickle, deepcopy, == and
dataclasses.replace read it as one."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from grpo_kernels import GRPOLossConfig

LOSS_TYPES = st.sampled_from(["sapo", "vespo", "grpo"])  # with hyper-parameters of their own, and without
VALUES = st.floats(0.5, 4.0)


def mutations(config: GRPOLossConfig, key: str, value: float):
    params = config.loss_params
    return {"setitem": lambda: params.__setitem__(key, value), "delitem": lambda: params.__delitem__(key),
            "update": lambda: params.update({key: value}), "ior": lambda: params.__ior__({key: value}),
            "pop": lambda: params.pop(key), "popitem": lambda: params.popitem(),
            "setdefault": lambda: params.setdefault(key, value), "clear": lambda: params.clear()}


@settings(max_examples=60, deadline=None)
@given(loss_type=LOSS_TYPES, operation=st.sampled_from(["setitem", "delitem", "update", "ior", "pop", "popitem",
                                                        "setdefault", "clear"]),
       value=VALUES, data=st.data())
def test_no_change_in_place_reaches_a_built_config(loss_type, operation, value, data):
    config = GRPOLossConfig(loss_type=loss_type)
    key = data.draw(st.sampled_from(sorted(config.loss_params) or ["temperature_pos"]))
    before, hashed, in_a_set = dict(config.loss_params), hash(config), {config}
    with pytest.raises(TypeError) as refused:
        mutations(config, key, value)[operation]()
    message = str(refused.value)
    assert "\n" not in message and "loss_params is read-only" in message and "dataclasses.replace" in message
    assert dict(config.loss_params) == before and hash(config) == hashed and config in in_a_set


@settings(max_examples=20, deadline=None)
@given(loss_type=st.sampled_from(["sapo", "vespo"]), value=VALUES)
def test_it_is_still_a_dict_to_every_reader(loss_type, value):
    config = GRPOLossConfig(loss_type=loss_type)
    assert isinstance(config.loss_params, dict) and config.loss_params == dict(config.loss_params)
    for copied in (pickle.loads(pickle.dumps(config)), copy.deepcopy(config), copy.copy(config)):
        assert copied == config and hash(copied) == hash(config)
    written = dataclasses.asdict(config)
    assert json.loads(json.dumps(written))["loss_params"] == config.loss_params
    assert type(written["loss_params"]) is dict  # asdict's copy is the caller's, and any YAML dumper writes it
    assert yaml.safe_load(yaml.safe_dump(written))["loss_params"] == config.loss_params
    key = next(iter(config.loss_params))
    changed = dataclasses.replace(config, loss_params={**config.loss_params, key: value})
    assert changed.loss_params[key] == value and config.loss_params[key] != value or value == config.loss_params[key]
    mutable = config.loss_params.copy()
    mutable[key] = value  # copy() is a plain dict to change
    assert type(mutable) is dict


def test_torch_compile_reads_it_in_one_graph():
    """A registered term reads x.config.loss_params[name] inside the compiled loss: no graph break (dynamo cannot
    subscript a dict subclass that overrides __new__, which is why the class uses a metaclass)."""
    import torch

    torch._dynamo.reset()
    config = GRPOLossConfig(loss_type="sapo")
    compiled = torch.compile(lambda x: x * config.loss_params["temperature_pos"], backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(torch.ones(2)), torch.full((2,), config.loss_params["temperature_pos"]))
