"""The rollout-backend registry (grpo_engine/rollout/registry.py): the schema's choices, the sections each backend reads,
the rules on what a backend supports and the install check come from the entries. A backend of a test's own
(tests/support/uniform_rollout.py, one module) registered with one entry works through the config, the CLI and a
training step."""

from __future__ import annotations

import json

import pytest
import uniform_rollout

from grpo_engine.cli import main
from grpo_engine.config import ConfigError, load_config
from grpo_engine.config.applicability import inapplicable_settings
from grpo_engine.rollout import (ROLLOUT_BACKENDS, RolloutSpec, register_rollout_backend, rollout_backend,
                            unregister_rollout_backend)

SMALL = ["--data.builtin_max_operand", "2", "--rollout.num_generations", "4", "--rollout.max_new_tokens", "8",
         "--optim.per_device_train_batch_size", "8", "--run.loss_backend", "torch", "--run.progress_bar", "false",
         "--run.plot", "false", "--run.warm_start_steps", "0", "--run.max_steps", "1",
         "--run.log_completions_steps", "0"]


@pytest.fixture()
def uniform():
    spec = register_rollout_backend(RolloutSpec("uniform_test", "uniform_rollout", "uniform random tokens (a test's)",
                                                kept_token_sets=False))
    uniform_rollout.GENERATED.clear()
    yield spec
    unregister_rollout_backend("uniform_test")


def test_a_registered_backend_is_a_choice_and_its_entry_decides_the_rules(uniform):
    assert load_config(overrides={"rollout.backend": "uniform_test"}).rollout.backend == "uniform_test"
    with pytest.raises(ConfigError, match="rollout.backend uniform_test does not return the kept-token sets"):
        load_config(overrides={"rollout.backend": "uniform_test", "rollout.top_k": 5})
    with pytest.raises(ConfigError, match=r"rollout.max_staleness \(1\) needs rollout.backend vllm_server"):
        load_config(overrides={"rollout.backend": "uniform_test", "rollout.max_staleness": 1})
    idle = load_config(overrides={"rollout.backend": "uniform_test", "rollout.server.timeout_s": 5.0})
    notes = inapplicable_settings(idle, load_config())
    assert any(note.startswith("rollout.server.timeout_s is set") for note in notes)
    with pytest.raises(ValueError, match="already registered"):
        register_rollout_backend(uniform)


def test_a_registered_backend_trains_a_step_through_the_cli(uniform, tmp_path):
    run_dir = tmp_path / "run"
    assert main(["train", "--rollout.backend", "uniform_test", "--output-dir", str(run_dir), *SMALL]) == 0
    assert uniform_rollout.GENERATED  # the trainer sampled from it
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in steps if "reward" in row] == [1]


def test_an_unknown_backend_is_refused_listing_the_registry_and_case_variants_are_refused():
    with pytest.raises(ConfigError, match="rollout.backend: expected one of hf, vllm, vllm_server, got 'sglang'"):
        load_config(overrides={"rollout.backend": "sglang"})
    with pytest.raises(ValueError, match="differs from the registered 'hf' only in case"):
        register_rollout_backend(RolloutSpec("HF", "uniform_rollout", "another"))
    assert set(ROLLOUT_BACKENDS) == {"hf", "vllm", "vllm_server"}
    assert rollout_backend("vllm_server").generates_ahead and not rollout_backend("hf").generates_ahead
