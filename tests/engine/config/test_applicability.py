"""A setting set away from its default where it does not apply is said at the start of the run (it would change
nothing, silently), and only then: every entry of engine/config/applicability.py's table, both ways."""

from __future__ import annotations

import pytest

from engine.config import apply_overrides, config_from_dict, leaf_keys, load_config
from engine.config.applicability import RULES, covered, inapplicable_settings
from engine.data.demo_task import DEMO_PRESET

# A value other than the default for every key a rule covers (valid for the key alone)
OTHER_VALUE = {
    "rollout.server.urls": ["http://10.0.0.2:8000"], "rollout.server.model": "served",
    "rollout.server.timeout_s": 30.0, "rollout.server.request_timeout_s": 60.0,
    "rollout.server.max_concurrent_requests": 8, "rollout.server.weight_transfer": "reload",
    "rollout.server.lora_transfer": "merged", "rollout.server.weights_dir": "/shared/weights",
    "rollout.server.nccl_host": "10.0.0.1", "rollout.server.nccl_port": 29800,
    "rollout.vllm.gpu_memory_utilization": 0.5, "rollout.vllm.sleep": True, "rollout.vllm.tensor_parallel_size": 2,
    "rollout.vllm.kv_cache_mb": 512, "rollout.vllm.max_model_len": 4096,
    "model.lora.r": 8, "model.lora.alpha": 16, "model.lora.dropout": 0.1, "model.lora.target_modules": ["q_proj"],
    "optim.max_tokens_per_micro_batch": 4096,
    "loss.sapo_temperature_pos": 2.0, "loss.sapo_temperature_neg": 2.0,
    "loss.vespo_k_pos": 1.0, "loss.vespo_lambda_pos": 1.0, "loss.vespo_k_neg": 1.0, "loss.vespo_lambda_neg": 1.0,
    "rewards.math_correct": 2.0, "rewards.math_wrong": 0.0, "rewards.math_no_answer": 0.0,
    "rewards.length_cache": 8,
    "data.builtin_max_operand": 20, "data.builtin_eval_size": 5,
    "data.eval_split": "validation",
    "rollout.importance_sampling_cap": 5.0,
    "run.warm_start_learning_rate": 1e-2, "run.warm_start_target": 0.5,
}
# What makes each rule apply, and what keeps it from applying (besides the defaults)
APPLY = {
    "rollout.backend vllm_server": {"rollout.backend": "vllm_server"},
    "rollout.backend vllm": {"rollout.backend": "vllm"},
    "model.lora.enabled true": {"model.lora.enabled": True},
    "optim.padding_free true": {"optim.padding_free": True},
    "loss.loss_type sapo": {"loss.loss_type": "sapo"},
    "loss.loss_type vespo": {"loss.loss_type": "vespo"},
    "math_accuracy in rewards.functions": {"rewards.functions": ["math_accuracy"]},
    "length in rewards.functions": {"rewards.functions": ["length"]},
    "data.path null (the built-in addition task)": {},
    "data.eval_path set": {"data.eval_path": "org/eval-set"},
}
NOT_APPLY = {
    "optim.padding_free true": {"optim.padding_free": False},
    "length in rewards.functions": {"rewards.functions": ["math_accuracy"]},
    "math_accuracy in rewards.functions": {"rewards.functions": ["length"]},
    "data.path null (the built-in addition task)": {"data.path": "org/train-set"},
    "loss.loss_type sapo": {"loss.loss_type": "grpo"},
}
CASES = [(rule, key) for rule in RULES for key in leaf_keys() if covered(rule, key)]


# Other keys a value above needs beside it (a rule across keys of the schema)
COMPANIONS = {"rollout.vllm.tensor_parallel_size": {"model.tensor_parallel": 2}}


def build(overrides: dict):
    """The config of these overrides, whether or not this machine could run it (vLLM need not be installed)."""
    extra = {k: v for key in overrides for k, v in COMPANIONS.get(key, {}).items()}
    return config_from_dict(apply_overrides({}, {**extra, **overrides}))


def test_every_rule_covers_keys_of_the_schema_and_each_has_a_value_here():
    for rule in RULES:
        keys = [key for key in leaf_keys() if covered(rule, key)]
        assert keys, f"{rule.keys} match no key of the schema"
        assert all(key in OTHER_VALUE for key in keys), [key for key in keys if key not in OTHER_VALUE]


@pytest.mark.parametrize("rule, key", CASES, ids=[key for _, key in CASES])
def test_a_setting_that_does_not_apply_is_named_and_one_that_applies_is_not(rule, key):
    defaults = load_config()
    idle = build({**NOT_APPLY.get(rule.condition, {}), key: OTHER_VALUE[key]})
    assert not rule.applies(idle)
    notes = inapplicable_settings(idle, defaults)
    assert any(note.startswith(f"{key} is set (") and rule.condition in note for note in notes), notes
    if rule.condition in APPLY:
        active = build({**APPLY[rule.condition], key: OTHER_VALUE[key]})
        assert rule.applies(active)
        assert not any(note.startswith(f"{key} ") for note in inapplicable_settings(active, defaults))


def test_the_defaults_and_the_demo_say_nothing():
    assert inapplicable_settings(load_config(), load_config()) == []
    demo = load_config(preset=DEMO_PRESET)
    assert inapplicable_settings(demo, load_config(preset=DEMO_PRESET)) == []
