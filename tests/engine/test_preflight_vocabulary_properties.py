"""A model directory whose tokenizer holds ids its model has no row for: tokens added to the tokenizer (or the default
EOS transformers adds to a tokenizer saved without one), a config.json's vocab_size below the tokenizer's length. The
pre-flight refuses each in one line naming the directory, before any weight loads; a tokenizer within the vocabulary
passes (hypothesis). Before, the refusal came after the model loaded (check_tokenizer_fits on the embedding)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine import run_setup
from grpo_engine.config import load_config
from grpo_engine.preflight import PreflightError, preflight
from grpo_engine.trainer import train
from model_variants import model_variant

ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(vocab_size=st.integers(95, 103), added=st.integers(0, 3))
def test_a_tokenizer_past_the_declared_vocabulary_is_refused_before_any_weight_loads(tiny_model_dir, vocab_size, added,
                                                                                       tmp_path_factory):
    path, tokens = model_variant(tiny_model_dir, tmp_path_factory.mktemp("variant") / "m", vocab_size, added=added)
    config = load_config(overrides={"model.name_or_path": path, "run.output_dir": "unused", "rollout.max_new_tokens": 4})
    try:
        preflight(config, ROWS, [], path)
    except PreflightError as exc:
        message = str(exc)
        assert tokens > vocab_size, message
        assert "\n" not in message and repr(path) in message and f"{vocab_size} rows" in message, message
        return
    assert tokens <= vocab_size


def test_a_train_run_on_such_a_model_stops_before_the_model_loads(tiny_model_dir, tmp_path, monkeypatch):
    path, _ = model_variant(tiny_model_dir, tmp_path / "m", 99, added=2)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))

    def loaded(*args, **kwargs):
        raise AssertionError("the model loaded before its tokenizer was checked")

    monkeypatch.setattr(run_setup, "load_causal_lm", loaded)
    config = load_config(overrides={"model.name_or_path": path, "data.path": str(data),
                                    "run.output_dir": str(tmp_path / "run"), "rollout.max_new_tokens": 4})
    with pytest.raises(PreflightError, match="has 101 tokens but config.json's vocab_size has 99 rows"):
        train(config)
