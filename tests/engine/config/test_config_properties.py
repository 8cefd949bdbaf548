"""Property-based tests of the configuration: values generated over every key's declared range and past it,
given as overrides, as flags and in YAML files. Each is accepted and reads back equal (through the saved
config.yaml too), or refused with one line that names the key; never another exception, never a silent change.

The strategies are derived from the schema itself (types, bounds, choices); the few keys whose validity is a
function (paths, registries) get theirs below.
"""

from __future__ import annotations

import argparse
import math
import os
import types
import typing
from typing import Annotated, Any, Literal

import annotated_types as at
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic.fields import FieldInfo

from grpo_engine.cli import join_flag_values, _overrides, build_parser
from grpo_engine.cli_parser import CommandLineError
from grpo_engine.config import (
    ConfigError,
    config_from_yaml,
    config_yaml,
    is_hub_id,
    leaf_fields,
    load_config,
)
from grpo_engine.config.schema import ALL_LINEAR, BUILTIN_REWARDS, MAX_BUILTIN_OPERAND, MAX_COUNT
from grpo_engine.config.strict_yaml import StrictDumper, dump_yaml
from setting_kinds import list_keys, path_keys
from grpo_kernels.backends import backend_names
from grpo_kernels.losses import loss_type_names

# Generated loss settings meet the kernels' TRL-style warnings on unusual combinations (a sequence-level ratio with a
# token-level loss type): those are asserted in tests/grpo_kernels; here they are expected output.
pytestmark = pytest.mark.filterwarnings("ignore:.*importance_sampling_level=:UserWarning")

FIELDS = leaf_fields()
PATH_KEYS = path_keys()
LIST_KEYS = list_keys()
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

HUB_IDS = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_-]{0,8}/[A-Za-z0-9][A-Za-z0-9_-]{0,8}\Z").filter(is_hub_id)
# Keys whose valid values a validator function decides; the defaults of the other keys must hold with them
# (e.g. rollout.vllm.max_model_len at least data.max_prompt_length + rollout.max_new_tokens = 768).
SPECIAL_VALID = {
    "model.name_or_path": st.none() | HUB_IDS,
    "data.path": st.none() | HUB_IDS,
    "data.eval_path": st.none() | HUB_IDS,
    "loss.loss_type": st.sampled_from(loss_type_names()),
    "loss.params": st.just({}),
    "rollout.backend": st.just("hf"),  # vllm: refused naming the key where vLLM is not installed
    "run.loss_backend": st.sampled_from(backend_names()),
    "rewards.functions": st.lists(st.sampled_from(BUILTIN_REWARDS) | st.from_regex(r"\A[a-z_][a-z0-9_.]{0,10}:[a-z_]"
                                                                                   r"[a-z0-9_]{0,10}\Z"),
                                  min_size=1, max_size=1),
    "rewards.weights": st.none() | st.lists(st.floats(allow_nan=False, allow_infinity=False).filter(bool), min_size=1,
                                            max_size=1),  # all 0: refused (test_config_loading)
    # Each at least data.max_prompt_length + rollout.max_new_tokens, both drawn up to 2**29 below, and at most
    # MAX_COUNT (every integer key's ceiling).
    "rollout.vllm.max_model_len": st.none() | st.integers(2**30, MAX_COUNT),
    "optim.max_tokens_per_micro_batch": st.none() | st.integers(2**30, MAX_COUNT),
    "data.max_prompt_length": st.none() | st.integers(1, 2**29),
    "rollout.vllm.tensor_parallel_size": st.just(1),
    "rewards.length_cache": st.integers(0, 256),
    "rollout.max_new_tokens": st.integers(256, 2**29),  # at least rewards.length_cache (up to 256 here)
    "run.warm_start_steps": st.just(0),
    "rollout.max_staleness": st.just(0),
    "rollout.server.lora_transfer": st.sampled_from(["auto", "merged"]),  # adapter only with LoRA (a rule across keys)
    "rollout.server.urls": st.lists(st.from_regex(r"\Ahttps?://[a-z][a-z0-9.-]{0,20}(:[1-9][0-9]{0,3})?\Z"), min_size=1,
                                    max_size=2, unique_by=lambda url: url.split("//")[1].split(":")[0]),  # each server once  # > 0 only with rollout.backend vllm_server (a cross-field rule)
    "data.builtin_max_operand": st.integers(9, MAX_BUILTIN_OPERAND),  # with data.builtin_eval_size below its problems
    "data.builtin_eval_size": st.integers(0, 99),  # > 0 only with the built-in model; default name_or_path is null
}


def _bounds(metadata: list) -> dict[str, Any]:
    found = {}
    for item in metadata:
        for name in ("ge", "gt", "le", "lt", "min_length"):
            if isinstance(item, (at.Ge, at.Gt, at.Le, at.Lt, at.MinLen)) and hasattr(item, name):
                found[name] = getattr(item, name)
    return found


def _split(tp: Any, metadata: list) -> tuple[Any, list]:
    """The type under Annotated[...] and its constraints (a Field(...) inside Annotated holds them in turn)."""
    while typing.get_origin(tp) is Annotated:
        inner, *extra = typing.get_args(tp)
        tp, metadata = inner, [*metadata, *extra]
    return tp, [part for item in metadata for part in (item.metadata if isinstance(item, FieldInfo) else [item])]


def valid_values(tp: Any, metadata: list = ()) -> st.SearchStrategy:
    """Every value the type and its bounds admit."""
    tp, metadata = _split(tp, list(metadata))
    origin, bounds = typing.get_origin(tp), _bounds(metadata)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(valid_values(arg) for arg in typing.get_args(tp)))
    if tp is type(None):
        return st.none()
    if origin is Literal:
        return st.sampled_from(typing.get_args(tp))
    if origin is list:
        return st.lists(valid_values(typing.get_args(tp)[0]), min_size=bounds.get("min_length", 0), max_size=4)
    if tp is bool:
        return st.booleans()
    if tp is int:
        low = bounds["ge"] if "ge" in bounds else bounds["gt"] + 1 if "gt" in bounds else None
        return st.integers(low, bounds.get("le"))
    if tp is float:
        low = bounds.get("ge", bounds.get("gt"))
        high = bounds.get("le", bounds.get("lt"))
        return st.floats(low, high, exclude_min="gt" in bounds, exclude_max="lt" in bounds, allow_nan=False,
                         allow_infinity=False)
    if tp is str:  # blank text names nothing (Section._no_blank_text); free text takes it: valid_for
        return st.text().filter(str.strip)
    raise AssertionError(f"no strategy for {tp!r}")


def invalid_values(tp: Any, metadata: list = ()) -> st.SearchStrategy:
    """Values of another type than the field's, or past its bounds (none of them admitted)."""
    tp, metadata = _split(tp, list(metadata))
    origin, bounds = typing.get_origin(tp), _bounds(metadata)
    not_numbers = st.text() | st.lists(st.integers(), max_size=2) | st.none()
    if origin in (typing.Union, types.UnionType):
        kinds = {typing.get_origin(_split(arg, [])[0]) or _split(arg, [])[0] for arg in typing.get_args(tp)}
        if str in kinds:  # str | list[str]: numbers and booleans
            return st.integers() | st.booleans() | st.floats(allow_nan=False)
        inner = [arg for arg in typing.get_args(tp) if arg is not type(None)]
        return invalid_values(inner[0]).filter(lambda value: value is not None)
    if origin is Literal:
        return st.text().filter(lambda text: text not in typing.get_args(tp)) | st.integers()
    if origin is list:  # one value alone is a list of one: a wrong item, alone or in a list, or a mapping
        item = invalid_values(typing.get_args(tp)[0])
        return item | st.lists(item, min_size=1, max_size=2) | st.dictionaries(st.text(), st.integers(), max_size=2)
    if tp is bool:
        return st.integers() | st.text() | st.floats(allow_nan=False) | st.none()
    if tp is int:
        past = [st.integers(max_value=bounds["ge"] - 1)] if "ge" in bounds else []
        past += [st.integers(max_value=bounds["gt"])] if "gt" in bounds else []
        past += [st.integers(min_value=bounds["le"] + 1)] if "le" in bounds else []
        fractional = st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not x.is_integer())
        return st.one_of(*past, fractional, st.booleans(), not_numbers)
    if tp is float:
        past = [st.floats(max_value=bounds["ge"], exclude_max=True, allow_nan=False)] if "ge" in bounds else []
        past += [st.floats(max_value=bounds["gt"], allow_nan=False)] if "gt" in bounds else []
        past += [st.floats(min_value=bounds["le"], exclude_min=True, allow_nan=False)] if "le" in bounds else []
        past += [st.floats(min_value=bounds["lt"], allow_nan=False)] if "lt" in bounds else []
        return st.one_of(*past, st.sampled_from([math.nan, math.inf, -math.inf]), st.booleans(), not_numbers)
    if tp is str:
        return st.integers() | st.floats(allow_nan=False) | st.booleans() | st.lists(st.text(), max_size=2)
    raise AssertionError(f"no strategy for {tp!r}")


def valid_for(key: str) -> st.SearchStrategy:
    field = FIELDS[key]
    if key in SPECIAL_VALID:
        return SPECIAL_VALID[key]
    valid = valid_values(field.annotation, field.metadata)
    return valid | st.text(alphabet=" \t", max_size=3) if (field.json_schema_extra or {}).get("free_text") else valid


def invalid_for(key: str) -> st.SearchStrategy:
    field = FIELDS[key]
    return invalid_values(field.annotation, field.metadata)


GENERIC_KEYS = sorted(key for key in FIELDS if key not in SPECIAL_VALID or key in (
    "data.builtin_max_operand", "data.builtin_eval_size", "data.max_prompt_length", "rewards.length_cache", "rollout.max_new_tokens", "rollout.vllm.max_model_len",
    "optim.max_tokens_per_micro_batch", "rollout.vllm.tensor_parallel_size"))


@st.composite
def valid_settings(draw, max_keys: int = 6) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from(sorted(FIELDS)), min_size=1, max_size=max_keys, unique=True))
    return {key: draw(valid_for(key)) for key in keys}


def value_at(config, key: str) -> Any:
    for part in key.split("."):
        config = getattr(config, part)
    return config


def same(written: Any, stored: Any) -> bool:
    """Equal, and of the written kind (an int written for a float key is stored as that float)."""
    if isinstance(written, bool) or isinstance(stored, bool):
        return type(written) is type(stored) and written == stored
    if isinstance(written, list):
        return isinstance(stored, list) and len(written) == len(stored) and all(map(same, written, stored))
    return written == stored


def stored_form(key: str, value: Any) -> Any:
    """What the config holds for `value` written for `key`: a path setting's leading ~ expanded (the shell's
    meaning), one value alone of a list setting as a list of one (test_setting_kinds.py walks both kinds)."""
    if key in PATH_KEYS and isinstance(value, str):
        return os.path.expanduser(value)
    if key in LIST_KEYS and isinstance(value, (str, int, float)) and value != ALL_LINEAR:
        return [value]
    return value


def accepted_or_named(overrides: dict[str, Any], load) -> Any:
    """The config `load` builds from `overrides`, or None when refused with one line naming one of their keys."""
    try:
        config = load()
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message, message
        assert any(key in message or f"--{key}" in message for key in overrides), (overrides, message)
        return None
    for key, value in overrides.items():
        if key != "loss.params":
            assert same(stored_form(key, value), value_at(config, key)), (key, value, value_at(config, key))
    assert config_from_yaml(config_yaml(config), "config.yaml") == config
    return config


# ------------------------------------------------------------------------------------------------ overrides

@SETTINGS
@given(valid_settings())
def test_values_in_the_declared_ranges_are_accepted_and_read_back_equal(overrides):
    # each value alone is in its key's range; together they may break a rule across keys (a prompt longer than
    # vLLM's max_model_len), which must then be refused in one line naming one of them
    accepted_or_named(overrides, lambda: load_config(overrides=overrides))


@SETTINGS
@given(st.data())
def test_values_past_the_declared_ranges_are_refused_naming_the_key(data):
    key = data.draw(st.sampled_from(GENERIC_KEYS))
    value = data.draw(invalid_for(key))
    with pytest.raises(ConfigError) as refused:
        load_config(overrides={key: value})
    message = str(refused.value)
    assert key in message and "\n" not in message


ANYTHING = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6)


@SETTINGS
@given(st.dictionaries(st.sampled_from(sorted(FIELDS)), ANYTHING, min_size=1, max_size=4))
def test_any_value_is_accepted_unchanged_or_refused_naming_the_key(overrides):
    accepted_or_named(overrides, lambda: load_config(overrides=overrides))


KEY_PARTS = st.from_regex(r"\A[a-z_]{1,12}\Z")


@SETTINGS
@given(st.lists(KEY_PARTS, min_size=1, max_size=3).map(".".join), ANYTHING)
def test_an_unknown_key_is_refused_naming_it(key, value):
    if key in FIELDS or any(name.startswith(key + ".") for name in FIELDS) or key.startswith("loss.params."):
        return
    with pytest.raises(ConfigError) as refused:
        load_config(overrides={key: value})
    message = str(refused.value)
    assert message.startswith("unknown key") or "is not a section" in message, message
    assert "\n" not in message


# ------------------------------------------------------------------------------------------------ flags

def flag_text(key: str, value: Any) -> str:
    """What a user types for `value`: a string as it is, anything else as in YAML."""
    if isinstance(value, str):
        return value
    return yaml.dump(value, Dumper=StrictDumper, default_flow_style=True, width=math.inf).removesuffix(
        "\n...\n").strip()


PARSER = build_parser()


TRAIN_OPTIONS = set(next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]
                    ._option_string_actions)


def _a_flags_name(text: str) -> bool:
    """Whether `text` is itself one of train's flags: given as a value, it is read as the flag whose value was left
    out, so such a value is given joined (--key=--model)."""
    return text.split("=", 1)[0] in TRAIN_OPTIONS


def from_flags(argv: list[str]):
    args = PARSER.parse_args(join_flag_values(["train", *argv]))
    return load_config(overrides=_overrides(args, {}))


def _nullable(key: str) -> bool:
    annotation = FIELDS[key].annotation
    return type(None) in typing.get_args(annotation)


@SETTINGS
@given(valid_settings())
@example({"model.fsdp": True, "model.tensor_parallel": 2})  # each in range, refused together
def test_flags_set_what_they_say(overrides):
    # `null` unsets a key that may be null: the one text a string key that may be null does not take as written.
    overrides = {key: value for key, value in overrides.items() if not (value == "null" and _nullable(key))}
    argv = [part for key, value in overrides.items()
            for part in ((f"--{key}={flag_text(key, value)}",) if _a_flags_name(flag_text(key, value))
                         else (f"--{key}", flag_text(key, value)))]
    # flags say what the same overrides say: both refuse a mix that breaks a rule across keys, else equal configs
    written = accepted_or_named(overrides, lambda: load_config(overrides=overrides))
    config = accepted_or_named(overrides, lambda: from_flags(argv))
    assert config == written, overrides


@SETTINGS
@given(key=st.sampled_from(sorted(FIELDS)), text=st.text())
@example(key="data.builtin_eval_size", text="--")  # the end of the options, not a value
@example(key="data.builtin_eval_size", text="-")  # YAML's list of one null
def test_any_flag_text_is_accepted_or_refused_naming_the_key(key, text, capsys):
    try:
        config = from_flags([f"--{key}", text])
    except ConfigError as exc:
        assert key in str(exc) and "\n" not in str(exc), str(exc)
        if text == "-" and key not in LIST_KEYS:
            assert "got '-'" in str(exc), str(exc)  # the text as typed, not the YAML it reads as ([None])
        return
    except CommandLineError:  # `--` ends the options (serve passes what follows to vLLM): argparse's one line
        line = capsys.readouterr().err.splitlines()[-1]
        assert f"argument --{key}: expected one argument" in line and (text == "--" or _a_flags_name(text)), line
        return
    stored = value_at(config, key)
    if isinstance(stored, str):
        assert stored == stored_form(key, text)  # a string key takes the text as written (a path's ~ expanded)
    assert config_from_yaml(config_yaml(config), "config.yaml") == config


# ------------------------------------------------------------------------------------------------ YAML files

def nested(overrides: dict[str, Any]) -> dict:
    tree: dict = {}
    for key, value in overrides.items():
        *sections, leaf = key.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return tree


@SETTINGS
@given(valid_settings(), st.sampled_from(["strict", "yaml 1.1"]))
def test_yaml_files_load_what_they_say(tmp_path_factory, overrides, writer):
    path = tmp_path_factory.mktemp("yaml") / "c.yaml"
    tree = nested(overrides)
    if writer == "strict":  # as the engine saves config.yaml: every value reads back as written
        path.write_text(dump_yaml(tree))  # values that break a rule across keys are refused naming one of them
        accepted_or_named(overrides, lambda: load_config(path))
    else:  # PyYAML's default writer (YAML 1.1): some strings are left bare that YAML 1.2 reads otherwise
        path.write_text(yaml.safe_dump(tree))  # escaped non-ASCII: PyYAML writes U+0085 bare, which reads as a break
        accepted_or_named(overrides, lambda: load_config(path))


@SETTINGS
@given(valid_settings(max_keys=3), st.data())
def test_a_key_written_twice_in_a_yaml_file_is_refused_naming_its_line(tmp_path_factory, overrides, data):
    path = tmp_path_factory.mktemp("yaml") / "c.yaml"
    text = dump_yaml(nested(overrides))
    lines = text.splitlines()
    top = [i for i, line in enumerate(lines) if line and not line.startswith(" ")]
    first = data.draw(st.sampled_from(top))
    end = next((i for i in top if i > first), len(lines))
    repeated = lines + lines[first:end]  # the section again at the end
    path.write_text("\n".join(repeated) + "\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    section = lines[first].split(":")[0]
    assert str(refused.value) == (f"config file {str(path)!r} line {len(lines) + 1}: key {section!r} given twice "
                                  f"in one mapping (first on line {first + 1})")


# ------------------------------------------------------------------------------------------------ text settings

def _takes_text(key: str) -> bool:
    annotation = str(FIELDS[key].annotation)
    free = (FIELDS[key].json_schema_extra or {}).get("free_text")
    return "str" in annotation and not annotation.startswith("dict") and not free


TEXT_KEYS = sorted(key for key in FIELDS if _takes_text(key))


def test_every_text_setting_is_found():
    # the rule below covers keys found by their type: a schema change that hides them would empty this list
    assert {"run.output_dir", "model.name_or_path", "data.path", "rollout.server.weights_dir",
            "rewards.functions", "data.prompt_column"} <= set(TEXT_KEYS)


@SETTINGS
@given(st.sampled_from(TEXT_KEYS), st.text(alphabet=" \t\n\r\x0b\x0c\u00a0\u2003", max_size=3), st.booleans())
def test_a_blank_text_is_refused_naming_the_key_however_it_arrives(key, blank, as_flag):
    # '' as a path is the working directory (a run writing into it, a model or data read from it)
    annotation = str(FIELDS[key].annotation)
    value = [blank] if annotation.startswith("list") or "list[" in annotation and "Union" not in annotation else blank
    with pytest.raises(ConfigError) as refused:
        if as_flag:
            from_flags([f"--{key}", flag_text(key, value)])
        else:
            load_config(overrides={key: value})
    assert key in str(refused.value) and "\n" not in str(refused.value)


@SETTINGS
@given(st.fixed_dictionaries({"rollout.backend": st.sampled_from(["hf", "vllm_server"]),
                              "model.lora.enabled": st.booleans(),
                              "rollout.server.lora_transfer": st.sampled_from(["auto", "adapter", "merged"]),
                              "rollout.server.weight_transfer": st.sampled_from(["auto", "nccl", "reload"])}))
def test_lora_transfer_is_adapters_exactly_when_lora_reaches_a_server_unmerged(overrides):
    """Adapters go to the servers exactly under vllm_server with LoRA and lora_transfer not merged; a combination
    that cannot work (adapter without LoRA; an explicit whole-weight transfer while adapters are sent) is refused
    in one line naming the key."""
    config = accepted_or_named(overrides, lambda: load_config(None, overrides))
    adapters = overrides["rollout.backend"] == "vllm_server" and overrides["model.lora.enabled"] and \
        overrides["rollout.server.lora_transfer"] != "merged"
    refused = (overrides["rollout.server.lora_transfer"] == "adapter" and not overrides["model.lora.enabled"]) or \
        (adapters and overrides["rollout.server.weight_transfer"] != "auto")
    assert (config is None) == refused, overrides
    if config is not None:
        assert config.pushes_lora_adapters() == adapters
