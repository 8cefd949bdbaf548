"""The pre-flight (grpo_engine/preflight.py): for configurations the schema accepts, on small real data, either a
training step completes or the run is refused in one line before any model weight loads (the model loaders are
instrumented to prove it). Then the cases the issue named, each refused before the loaders run."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from grpo_engine import run_setup
from grpo_engine.config import ConfigError, load_config
from grpo_engine.preflight import PreflightError, preflight, prompt_lengths
from grpo_engine.trainer import train
from grpo_kernels.losses import loss_type_names

pytestmark = pytest.mark.filterwarnings("ignore:.*importance_sampling_level=:UserWarning")


@contextmanager
def loads_recorded():
    """Every call of the weight loaders (a model directory's, the built-in model's builder), in order."""
    calls: list[str] = []
    real_load, real_builtin = run_setup.load_causal_lm, run_setup._builtin_base_model

    def load(*args, **kwargs):
        calls.append("load_causal_lm")
        return real_load(*args, **kwargs)

    def builtin(*args, **kwargs):
        calls.append("built-in model")
        return real_builtin(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_setup, "load_causal_lm", load)
        patch.setattr(run_setup, "_builtin_base_model", builtin)
        yield calls


def write_rows(path: Path, prompts: list[str]) -> str:
    # json.dumps writes a lone surrogate as its \\ud800 escape, which json.loads reads back as that surrogate
    path.write_text("".join(json.dumps({"prompt": prompt, "answer": "2"}) + "\n" for prompt in prompts))
    return str(path)


PROMPT_TEXT = st.text(st.characters(codec=None, exclude_categories=("Cc",)) | st.sampled_from("0123456789+=\udc80"),
                      min_size=1, max_size=12)
PROMPTS = st.lists(st.tuples(PROMPT_TEXT, st.integers(1, 30)).map(lambda pair: pair[0] * pair[1]), min_size=1,
                   max_size=3)
SETTINGS = st.fixed_dictionaries({
    "data.max_prompt_length": st.none() | st.integers(1, 160),
    "rollout.max_new_tokens": st.integers(1, 160),
    "optim.padding_free": st.booleans(),
    "optim.max_tokens_per_micro_batch": st.none() | st.integers(1, 320),
    "run.seed": st.integers(0, 2**32 - 1),
    "loss.beta": st.sampled_from([0.0, 0.04]),
    "loss.loss_type": st.sampled_from(loss_type_names()),
    "data.system_prompt": st.none() | st.sampled_from(["Answer briefly.", "\u00e9t\u00e9 \U0001f600"]),
    "loss.importance_sampling_level": st.sampled_from(["token", "sequence"]),
    "rollout.top_k": st.integers(0, 5),
    "rollout.temperature": st.floats(0.05, 4.0),
    "optim.num_iterations": st.integers(1, 2),
    "rollout.mask_truncated_completions": st.booleans(),
})


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(PROMPTS, SETTINGS)
def test_a_step_completes_or_the_refusal_comes_before_any_weight_loads(tmp_path_factory, tiny_model_dir, prompts,
                                                                       chosen):
    tmp = tmp_path_factory.mktemp("preflight")
    overrides = {**chosen, "model.name_or_path": str(tiny_model_dir), "data.path": write_rows(tmp / "d.jsonl", prompts),
                 "run.output_dir": str(tmp / "run"), "run.max_steps": 1, "run.progress_bar": False,
                 "run.plot": False, "run.log_completions_steps": 0, "run.loss_backend": "torch",
                 "run.device": "cpu", "rollout.num_generations": 2, "optim.per_device_train_batch_size": 2}
    try:
        config = load_config(overrides=overrides)
    except ConfigError as exc:  # the schema's refusal: before anything at all
        assert "\n" not in str(exc)
        event("refused by the schema")
        return
    with loads_recorded() as loads:
        try:
            summary = train(config)
        except (ValueError, RuntimeError, OSError) as exc:
            assert loads == [], f"refused after a model loaded: {type(exc).__name__}: {exc}"
            assert "\n" not in str(exc), str(exc)
            event(f"refused before loading: {type(exc).__name__}")
            return
    event("a step completed")
    assert loads == ["load_causal_lm"] and summary.steps == 1 and len(summary.rewards) == 1


def refused_before_loading(overrides: dict) -> str:
    """The one-line refusal of a run with `overrides`, asserting no loader ran."""
    with loads_recorded() as loads:
        with pytest.raises((ValueError, RuntimeError)) as refused:
            train(load_config(overrides=overrides))
    assert loads == [] and "\n" not in str(refused.value)
    return str(refused.value)


def test_a_lone_surrogate_in_a_prompt_is_named_with_its_row_before_the_model_loads(tiny_model_dir, tmp_path):
    data = write_rows(tmp_path / "d.jsonl", ["1+1=", "2+\ud800="])
    message = refused_before_loading({"model.name_or_path": str(tiny_model_dir), "data.path": data,
                                      "run.output_dir": str(tmp_path / "run")})
    assert message.startswith(f"dataset {data!r} row 1 column 'prompt' holds a lone UTF-16 surrogate U+D800")
    assert not (tmp_path / "run" / "config.yaml").exists()  # nothing written that a corrected command meets


@pytest.mark.parametrize("new_tokens, budget, limit", [
    (4, {"optim.max_tokens_per_micro_batch": 60}, "more than optim.max_tokens_per_micro_batch (one pack) (60)"),
    (16, {}, "more than the model's max_position_embeddings (128)"),
])
def test_the_longest_prompt_against_the_packing_budget_and_the_positions(new_tokens, budget, limit, tiny_model_dir,
                                                                         tmp_path):
    data = write_rows(tmp_path / "d.jsonl", ["1+1=", "1+1=" * 30])  # 120 tokens with the character tokenizer
    message = refused_before_loading({"model.name_or_path": str(tiny_model_dir), "data.path": data,
                                      "run.output_dir": str(tmp_path / "run"), "data.max_prompt_length": None,
                                      "rollout.max_new_tokens": new_tokens, **budget})
    assert f"row 1: a prompt of 120 tokens plus rollout.max_new_tokens ({new_tokens}) is {120 + new_tokens} " \
           f"tokens, {limit}" in message


def test_the_built_in_task_is_checked_from_the_built_in_tokenizer_without_building_the_model(tmp_path):
    message = refused_before_loading({"run.output_dir": str(tmp_path / "run"), "rollout.max_new_tokens": 125,
                                      "rewards.functions": ["math_accuracy"]})
    assert message.startswith("the built-in task row ") and "max_position_embeddings (128)" in message


def test_the_vllm_engines_derived_seeds_stay_in_the_rngs_domain():
    from grpo_engine.rollout.vllm import check

    config = load_config(overrides={"run.seed": 2**32 - 2, "rollout.vllm.kv_cache_mb": 16})
    with pytest.raises(ConfigError, match="the vLLM engines sample from run.seed \\+ their index, up to 4294967297"):
        check(config, None, num_processes=4)


def test_the_preflight_itself_passes_data_that_fits(tiny_model_dir):
    config = load_config(overrides={"model.name_or_path": str(tiny_model_dir), "rollout.max_new_tokens": 16})
    preflight(config, [{"prompt": "1+1="}], [{"prompt": "2+2="}], str(tiny_model_dir))


class PickyTokenizer:
    """A tokenizer that refuses one text and encodes another to no token (as a tokenizer may)."""

    def __call__(self, texts, add_special_tokens=False):
        texts = [texts] if isinstance(texts, str) else texts
        if "refused" in texts:
            raise TypeError("TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, InputSequence]]")
        return {"input_ids": [[] if text == "dropped" else [1] * len(text) for text in texts]}


@pytest.mark.parametrize("prompts, message", [
    (["fine", "refused"], "data row 1: the tokenizer cannot encode the prompt (TypeError: TextEncodeInput"),
    (["fine", "dropped"], "data row 1: the prompt is empty after tokenization ('dropped')"),
])
def test_a_prompt_the_tokenizer_refuses_or_empties_is_named_by_its_row(prompts, message):
    with pytest.raises(PreflightError) as refused:
        prompt_lengths(prompts, PickyTokenizer(), "data")
    assert str(refused.value).startswith(message)
