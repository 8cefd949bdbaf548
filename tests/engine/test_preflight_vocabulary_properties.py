"""A model directory whose tokenizer holds ids its model has no row for: tokens added to the tokenizer (or the default
EOS transformers adds to a tokenizer saved without one), a config.json's vocab_size below the tokenizer's length. The
pre-flight refuses each in one line naming the directory, before any weight loads; a tokenizer within the vocabulary
passes (hypothesis). Before, the refusal came after the model loaded (check_tokenizer_fits on the embedding)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine import run_setup
from grpo_engine.config import load_config
from grpo_engine.preflight import PreflightError, preflight
from grpo_engine.tools.rollout_speed import build_model
from grpo_engine.trainer import train

ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory) -> Path:
    """A random Qwen2 with the demo's character tokenizer (99 tokens, 99 embedding rows)."""
    path = tmp_path_factory.mktemp("model") / "m"
    build_model(str(path), 64, 1, seed=0)
    return path


def _variant(saved: Path, where: Path, vocab_size: int, added: int) -> tuple[str, int]:
    """A copy of `saved` declaring `vocab_size` rows, its tokenizer with `added` tokens more; (path, tokens)."""
    from transformers import AutoTokenizer

    shutil.copytree(saved, where)
    config = json.loads((where / "config.json").read_text())
    (where / "config.json").write_text(json.dumps({**config, "vocab_size": vocab_size}))
    tokenizer = AutoTokenizer.from_pretrained(where)
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(added)])
    tokenizer.save_pretrained(where)
    return str(where), len(tokenizer)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(vocab_size=st.integers(95, 103), added=st.integers(0, 3))
def test_a_tokenizer_past_the_declared_vocabulary_is_refused_before_any_weight_loads(saved_model, vocab_size, added,
                                                                                       tmp_path_factory):
    path, tokens = _variant(saved_model, tmp_path_factory.mktemp("variant") / "m", vocab_size, added)
    config = load_config(overrides={"model.name_or_path": path, "run.output_dir": "unused"})
    try:
        preflight(config, ROWS, [], path)
    except PreflightError as exc:
        message = str(exc)
        assert tokens > vocab_size, message
        assert "\n" not in message and repr(path) in message and f"{vocab_size} rows" in message, message
        return
    assert tokens <= vocab_size


def test_a_train_run_on_such_a_model_stops_before_the_model_loads(saved_model, tmp_path, monkeypatch):
    path, _ = _variant(saved_model, tmp_path / "m", 99, 2)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in ROWS))

    def loaded(*args, **kwargs):
        raise AssertionError("the model loaded before its tokenizer was checked")

    monkeypatch.setattr(run_setup, "load_causal_lm", loaded)
    config = load_config(overrides={"model.name_or_path": path, "data.path": str(data),
                                    "run.output_dir": str(tmp_path / "run"), "rollout.max_new_tokens": 4})
    with pytest.raises(PreflightError, match="has 101 tokens but config.json's vocab_size has 99 rows"):
        train(config)
