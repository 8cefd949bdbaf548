"""LoRA adapters evaluated on the base model their adapter_config.json names, when that base is another model than
the one they were trained on (hypothesis draws what differs: its widths, its layers' names, or nothing): one line
naming adapter_config.json and the base before either loads, exactly when peft could not load them. Before, peft
failed after both models had loaded: "RuntimeError: Error(s) in loading state_dict for PeftModelForCausalLM: size
mismatch for ...lora_A..." listing every adapter, or "Target modules {...} not found in the base model"."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.config import load_config
from grpo_engine.model.loading import ModelLoadError
from grpo_engine.tools.evaluate import load_eval_model

TARGETS = st.lists(st.sampled_from(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                                    "embed_tokens"]), min_size=1, max_size=3, unique=True)
# what the named base changes of the model the adapters were trained on: a config key and its factor, or nothing
CHANGES = st.sampled_from([None, ("hidden_size", 2), ("intermediate_size", 2), ("intermediate_size", 3),
                           ("num_key_value_heads", 0.5), ("vocab_size", 2)])


def _adapters(tiny_model_dir, directory, targets: list[str]) -> None:
    import peft
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft.get_peft_model(lm, peft.LoraConfig(r=2, target_modules=targets, task_type="CAUSAL_LM")).save_pretrained(
        directory)
    for tokenizer_file in tiny_model_dir.glob("*token*"):
        shutil.copy(tiny_model_dir / tokenizer_file.name, directory)


def _base(tiny_model_dir, directory, change) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_model_dir)
    if change is not None:
        key, factor = change
        setattr(config, key, int(getattr(config, key) * factor))
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    shutil.copytree(tiny_model_dir, directory, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.safetensors",
                                                                                                 "config.json"))


def _peft_loads(adapter_dir, base_dir) -> bool:
    """peft loads the adapters onto the base, every one the file holds (a target_modules list of which one name
    matches adapts that layer alone: the others' saved adapters are dropped with a warning)."""
    import peft
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    try:
        lm = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), str(adapter_dir))
    except Exception:
        return False
    with safe_open(str(adapter_dir / "adapter_model.safetensors"), framework="pt") as saved:
        adapted = {name.split(".lora_")[0] for name in saved.keys() if ".lora_" in name}
    loaded = {name.removesuffix(".default").split(".lora_")[0] for name, _ in lm.named_parameters() if ".lora_" in name}
    return adapted <= loaded


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(targets=TARGETS, change=CHANGES, renamed=st.booleans())
def test_adapters_on_another_base_are_one_line_naming_adapter_config_before_loading(targets, change, renamed,
                                                                                   tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    adapter_dir, base_dir = root / "adapters", root / "base"
    _adapters(tiny_model_dir, adapter_dir, targets)
    _base(tiny_model_dir, base_dir, change)
    settings_file = adapter_dir / "adapter_config.json"
    adapters = json.loads(settings_file.read_text())
    adapters["base_model_name_or_path"] = str(base_dir)
    if renamed:  # a config edited by hand, or copied from adapters of another family's layer names
        adapters["target_modules"] = [f"{targets[0]}_x"] + targets[1:]
    settings_file.write_text(json.dumps(adapters))
    config = load_config(overrides={"model.dtype": "float32"})
    try:
        load_eval_model(str(adapter_dir), config, torch.device("cpu"))
    except ModelLoadError as exc:
        message = str(exc)
        assert "\n" not in message and f"{settings_file} names the base model {str(base_dir)!r}" in message, message
        assert not _peft_loads(adapter_dir, base_dir), f"refused adapters peft loads: {message}"
        return
    assert _peft_loads(adapter_dir, base_dir)
