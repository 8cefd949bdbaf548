"""Property test: what a model directory's generation_config.json sets besides its token ids does not reach the
sampler. transformers' generate fills every setting the engine leaves unset from the model's own generation config:
a `min_p`, `no_repeat_ngram_size`, `min_new_tokens`, `suppress_tokens` or `bad_words_ids` there changed what was
sampled without a word (the loss scores the distribution of the rollout settings), and `num_beams` or
`prompt_lookup_num_tokens` failed inside generate at step 1. Drawn settings of the file's own keys, within the
ranges the model-file check takes, leave the sampled and the greedy completions, and their recorded log-probs, as
those of the same model without them; the model's own config is left as it was."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from grpo_engine.config import load_config
from grpo_engine.model.loading import HiddenStatePolicy, load_tokenizer
from grpo_engine.rollout.hf import generate_completions

DERANDOMIZE = bool(os.environ.get("CI"))
VOCAB = 99  # the built-in character tokenizer's ids
IDS = st.integers(0, VOCAB - 1)
PROBABILITY = st.floats(0.05, 0.99)

# generation_config.json keys with values generate takes (each changed the sampling or failed before the fix)
SETTINGS = {
    "min_p": PROBABILITY, "typical_p": PROBABILITY, "epsilon_cutoff": st.floats(1e-4, 0.05),
    "eta_cutoff": st.floats(1e-4, 0.05), "no_repeat_ngram_size": st.integers(1, 3),
    "min_new_tokens": st.integers(1, 10), "min_length": st.integers(5, 20),
    "suppress_tokens": st.lists(IDS, min_size=1, max_size=3), "begin_suppress_tokens": st.lists(IDS, min_size=1,
                                                                                              max_size=3),
    "bad_words_ids": st.lists(st.lists(IDS, min_size=1, max_size=2), min_size=1, max_size=2),
    "forced_eos_token_id": IDS, "forced_bos_token_id": IDS, "num_beams": st.integers(2, 3),
    "prompt_lookup_num_tokens": st.integers(1, 3), "renormalize_logits": st.just(True),
    "temperature": st.floats(0.1, 2.0), "top_k": st.integers(1, 20), "top_p": PROBABILITY,
    "repetition_penalty": st.floats(0.5, 2.0), "do_sample": st.booleans(), "max_length": st.integers(1, 5),
}


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    return lm, load_tokenizer(str(tiny_model_dir))


def _generate(lm, tokenizer, greedy: bool, wrapped: bool):
    config = load_config(overrides={"rollout.max_new_tokens": 10, "rollout.num_generations": 2,
                                    "rollout.top_k": 30, "rollout.top_p": 0.95}).rollout
    model = HiddenStatePolicy(lm) if wrapped else lm
    torch.manual_seed(0)
    batch = generate_completions(model, tokenizer, ["1+2=", "30+4="] * 2, config, None, torch.device("cpu"),
                                 greedy=greedy, record_kept=not greedy)
    return batch.completion_ids.tolist(), None if greedy else batch.sampler_logps.tolist()


@settings(max_examples=30, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(chosen=st.dictionaries(st.sampled_from(sorted(SETTINGS)), st.just(None), min_size=1, max_size=4),
       greedy=st.booleans(), wrapped=st.booleans(), data=st.data())
def test_a_model_generation_setting_changes_nothing_the_rollout_settings_decide(chosen, greedy, wrapped, data,
                                                                              model_and_tokenizer):
    lm, tokenizer = model_and_tokenizer
    expected = _generate(lm, tokenizer, greedy, wrapped)
    own = lm.generation_config
    drawn = {key: data.draw(SETTINGS[key], label=key) for key in chosen}
    lm.generation_config = own.__class__(**own.to_dict())
    for key, value in drawn.items():
        setattr(lm.generation_config, key, value)
    edited = lm.generation_config
    try:
        assert _generate(lm, tokenizer, greedy, wrapped) == expected
        assert lm.generation_config is edited and all(getattr(edited, k) == v for k, v in drawn.items())
    finally:
        lm.generation_config = own
