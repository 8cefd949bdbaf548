"""A setting set away from its default where it is not read is said at the start of the run (it would change
nothing, silently), and only then. The conditions are the schema's own declarations (ReadWhen beside each field):
this walks every setting of the schema, both ways, with a value of its own type other than its default."""

from __future__ import annotations

import typing
from typing import Any, Literal

import pytest

pytestmark = pytest.mark.filterwarnings("ignore:.*importance_sampling_level=:UserWarning")

from grpo_engine.config import apply_overrides, config_from_dict, leaf_fields, load_config
from grpo_engine.config.applicability import declared_conditions, inapplicable_settings, value_at
from grpo_engine.config.errors import ConfigError
from grpo_engine.config.schema import EngineConfig
from grpo_engine.data.demo_task import DEMO_PRESET

CONDITIONS = dict(declared_conditions(EngineConfig))
CONDITIONED = sorted(key for key, conditions in CONDITIONS.items() if conditions)
# Other keys a value needs beside it (a rule across keys of the schema)
COMPANIONS = {"rollout.vllm.tensor_parallel_size": {"model.tensor_parallel": 2},
              "rollout.max_staleness": {"rollout.backend": "vllm_server"}}


def build(overrides: dict):
    """The config of these overrides, whether or not this machine could run it (vLLM need not be installed)."""
    extra = {k: v for key in overrides for k, v in COMPANIONS.get(key, {}).items()}
    return config_from_dict(apply_overrides({}, {**extra, **overrides}))


def _candidates(annotation: Any, default: Any) -> list:
    """Values of the field's type other than its default, in the order they are tried."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is Literal:
        return list(args)
    found = [] if not args else [value for arg in args for value in _candidates(arg, None)]
    if isinstance(default, bool):
        return [not default]
    if isinstance(default, (int, float)):
        return [default * 2, default + 1, default / 2, 0.5]
    if isinstance(default, list):
        return [["q_proj"], ["http://10.0.0.2:8000"], ["length"], [2.0], ["wandb"]]
    return found + ["other-value", "grpo", "vllm_server", "torch", "/shared/weights", 2**20, 0.5, 8, ["q_proj"],
                    "org/name"]


def other_value(key: str, base: dict) -> Any:
    """A valid value of `key` other than its default (with the overrides `base`)."""
    field = leaf_fields()[key]
    default = field.get_default(call_default_factory=True)
    for value in _candidates(field.annotation, default):
        try:
            config = build({**base, key: value})
        except ConfigError:
            continue
        if value_at(config, key) != default:
            return value
    raise AssertionError(f"no other valid value found for {key}")


def test_conditions_are_declared_where_the_issue_found_none():
    for key in ("run.eval_steps", "run.eval_num_samples", "rollout.server.urls", "model.lora.r",
                "optim.max_tokens_per_micro_batch", "rewards.length_cache"):
        assert CONDITIONS[key], key


@pytest.mark.parametrize("key", CONDITIONED)
def test_a_setting_is_named_exactly_where_a_condition_it_declares_fails(key):
    defaults = load_config()
    for condition in CONDITIONS[key]:
        idle_base = dict(condition.when_false)
        idle = build({**idle_base, key: other_value(key, idle_base)})
        assert not condition.holds(idle), condition.text
        notes = inapplicable_settings(idle, defaults)
        assert any(note.startswith(f"{key} is set (") and condition.text in note for note in notes), notes
    active_base = {k: v for condition in CONDITIONS[key] for k, v in condition.when_true.items()}
    active = build({**active_base, key: other_value(key, active_base)})
    assert all(condition.holds(active) for condition in CONDITIONS[key])
    assert not any(note.startswith(f"{key} ") for note in inapplicable_settings(active, defaults))


# loss.params holds what the loss type declares (grpo_engine/config/loss_params.py), nothing of its own to set
@pytest.mark.parametrize("key", sorted(set(CONDITIONS) - set(CONDITIONED) - {"loss.params"}))
def test_a_setting_without_a_condition_is_never_named(key):
    base = {"data.path": "org/train"}  # every condition of the others fails at once, or holds by default
    config = build({**base, key: other_value(key, base)})
    assert not any(note.startswith(f"{key} ") for note in inapplicable_settings(config, load_config()))


def test_eval_settings_without_evaluation_data_warn():
    config = build({"data.path": "org/train", "run.eval_steps": 5, "run.eval_num_samples": 4})
    notes = inapplicable_settings(config, load_config())
    assert [note.split(" ")[0] for note in notes] == ["run.eval_steps", "run.eval_num_samples"]
    assert not inapplicable_settings(build({"data.path": "org/train", "data.eval_path": "org/eval",
                                            "run.eval_steps": 5}), load_config())


def test_the_defaults_and_the_demo_say_nothing():
    assert inapplicable_settings(load_config(), load_config()) == []
    demo = load_config(preset=DEMO_PRESET)
    assert inapplicable_settings(demo, load_config(preset=DEMO_PRESET)) == []


def test_the_built_in_model_without_the_preset_says_nothing_and_a_named_model_is_compared_with_the_schema_alone():
    # A config built in Python for the built-in model (load_config without the demo's preset, as the tests and a
    # script do) is at the schema's defaults: nothing is "set" there. The preset's values count only where it applies.
    from grpo_engine.run_setup import run_defaults

    plain = load_config()
    assert inapplicable_settings(plain, *run_defaults(plain)) == []
    demo = load_config(preset=DEMO_PRESET)
    assert inapplicable_settings(demo, *run_defaults(demo)) == []
    idle = build({"run.warm_start_steps": 0, "run.warm_start_target": 0.5})
    assert [note.split(" ")[0] for note in inapplicable_settings(idle, *run_defaults(idle))] == []  # the preset's
    named = build({"data.path": "org/train", "model.name_or_path": "org/model", "run.warm_start_target": 0.5})
    assert [note.split(" ")[0] for note in inapplicable_settings(named, *run_defaults(named))] == \
        ["run.warm_start_target"]
