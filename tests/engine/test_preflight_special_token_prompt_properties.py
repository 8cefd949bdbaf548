"""A text prompt made of the tokenizer's special tokens alone (`<pad>`, `<eos><eos>`: a text prompt is taken as
written, its markup included) gives the model no text to answer; before, the run trained on a prompt of padding,
silently. It is refused before any weight loads, naming the row; special tokens among other text are still taken
(hypothesis draws the prompts from both)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.model.loading import load_tokenizer
from grpo_engine.preflight import PreflightError, prompt_lengths

SPECIAL = ["<eos>", "<pad>", "<unk>"]  # the built-in character tokenizer's
TEXT = list("ab1+=?")
PIECES = st.lists(st.one_of(st.sampled_from(SPECIAL), st.sampled_from(TEXT)), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(PIECES, min_size=1, max_size=4))
def test_a_prompt_of_special_tokens_alone_is_refused_naming_its_row(prompts, tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    assert sorted(SPECIAL) == sorted(tokenizer.all_special_tokens)
    texts = ["".join(pieces) for pieces in prompts]
    markup = next((row for row, pieces in enumerate(prompts) if all(p in SPECIAL for p in pieces)), None)
    if markup is None:
        assert prompt_lengths(texts, tokenizer, "data") == [len(pieces) for pieces in prompts]
        return
    with pytest.raises(PreflightError) as refused:
        prompt_lengths(texts, tokenizer, "data")
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"data row {markup}: the prompt is only the tokenizer's "
                                                      f"special tokens"), message
