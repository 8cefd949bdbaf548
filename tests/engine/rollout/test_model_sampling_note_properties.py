"""A model directory's generation_config.json that recommends other sampling values than the rollout settings
(`temperature 0.6, top_k 20`, a `min_p`) is said in one warning line naming the file, each such key with its value,
and the rollout setting that applies instead; nothing is said when the values agree, the file recommends greedy
decoding, or it sets none. `train` says it when the run starts, `eval` when it samples (not greedy), before any
weight loads. Before, the rollout settings silently replaced the model's (by design: the loss scores the
distribution they define), so a user expecting the model's own values sampled with others without a word."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine import run_setup
from grpo_engine.cli import main
from grpo_engine.config import load_config
from grpo_engine.rollout.model_sampling import unapplied_model_sampling
from grpo_engine.tools import evaluate
from grpo_engine.trainer import train

FILE_VALUES = {
    "temperature": st.sampled_from([0.6, 0.8, 1.0]), "top_p": st.sampled_from([0.95, 1.0]),
    "top_k": st.sampled_from([0, 20, 50]), "repetition_penalty": st.sampled_from([1.0, 1.05]),
    "min_p": st.sampled_from([0.0, 0.05]), "typical_p": st.sampled_from([1.0, 0.9]),
    "no_repeat_ngram_size": st.sampled_from([0, 3]),
}
ROLLOUT = st.fixed_dictionaries({"rollout.temperature": st.sampled_from([0.6, 1.0]),
                                 "rollout.top_p": st.sampled_from([0.95, 1.0]), "rollout.top_k": st.sampled_from([0, 20]),
                                 "rollout.repetition_penalty": st.sampled_from([1.0, 1.05])})
NEUTRAL = {"min_p": 0.0, "typical_p": 1.0, "no_repeat_ngram_size": 0}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.fixed_dictionaries({}, optional=FILE_VALUES), do_sample=st.sampled_from([None, True, False]),
       rollout=ROLLOUT)
def test_the_model_recommended_values_that_are_not_applied_are_named(values, do_sample, rollout, tmp_path_factory):
    directory = tmp_path_factory.mktemp("model")
    file = {**values, **({} if do_sample is None else {"do_sample": do_sample}), "eos_token_id": 1}
    (directory / "generation_config.json").write_text(json.dumps(file))
    config = load_config(overrides=rollout).rollout
    note = unapplied_model_sampling(directory, config)
    differing = {key: value for key, value in values.items()
                 if value != (NEUTRAL[key] if key in NEUTRAL else getattr(config, key))}
    if do_sample is False or not differing:
        assert note is None, note
        return
    assert note is not None and "\n" not in note and str(directory / "generation_config.json") in note
    recommended = note.split(" recommends ", 1)[1].split(", which ", 1)[0]
    assert set(recommended.split(", ")) == {f"{key} {value}" for key, value in differing.items()}, note
    for key in differing:
        assert (key if key in NEUTRAL else f"rollout.{key} {getattr(config, key)}") in note.split("(", 1)[1], note
    assert ("; set rollout." in note) == any(key not in NEUTRAL for key in differing), note


@pytest.fixture()
def recommending_model(tiny_model_dir, tmp_path):
    directory = tmp_path / "recommending"
    shutil.copytree(tiny_model_dir, directory)
    config = json.loads((directory / "generation_config.json").read_text())
    (directory / "generation_config.json").write_text(json.dumps({**config, "temperature": 0.6, "top_k": 20}))
    return directory


class WeightsLoading(Exception):
    pass


@pytest.mark.parametrize("sampled", [True, False])
def test_eval_says_it_when_it_samples_before_weights_load(sampled, recommending_model, monkeypatch, capsys):
    def loading(*args, **kwargs):
        raise WeightsLoading

    monkeypatch.setattr(evaluate, "load_eval_model", loading)
    with pytest.raises(WeightsLoading):
        main(["eval", "--model", str(recommending_model), *(["--sample"] if sampled else [])])
    said = [line for line in capsys.readouterr().err.splitlines() if "recommends" in line]
    assert len(said) == sampled, said
    if sampled:
        assert "temperature 0.6, top_k 20, which the engine does not apply" in said[0], said


def test_train_says_it_when_the_run_starts(recommending_model, small_overrides, monkeypatch, caplog):
    class TokenizerLoading(Exception):
        pass

    def loading(*args, **kwargs):
        raise TokenizerLoading

    monkeypatch.setattr(run_setup, "load_tokenizer", loading)
    with caplog.at_level(logging.WARNING, logger="grpo_engine"), pytest.raises(TokenizerLoading):
        train(load_config(overrides={**small_overrides, "model.name_or_path": str(recommending_model)}))
    said = [r.getMessage() for r in caplog.records if "recommends" in r.getMessage()]
    assert len(said) == 1 and "rollout.temperature 1.0, rollout.top_k 0" in said[0], said
