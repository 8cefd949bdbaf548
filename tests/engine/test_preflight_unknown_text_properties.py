"""A prompt holding text the tokenizer has no token for (it reads it as its UNK token: the model would not see it,
while the reward functions see the text) is refused before any weight loads, naming the row and the text. Before,
the run trained on prompts whose characters had silently become UNK (or, through the tokenizer class of config.json's
model type, vanished)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.model.loading import load_tokenizer
from grpo_engine.preflight import PreflightError, prompt_lengths

# The built-in character tokenizer's characters: printable ASCII and a newline (no tab, no carriage return).
ALPHABET = [chr(code) for code in range(32, 127)] + ["\n"]
ASCII = st.text(st.sampled_from(ALPHABET), min_size=1, max_size=12)
FOREIGN = st.characters(min_codepoint=0xA1, exclude_categories=("Cs",))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(ASCII, min_size=1, max_size=4), data=st.data())
def test_a_character_the_tokenizer_lacks_is_named_with_its_row(prompts, data, tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    row = data.draw(st.integers(0, len(prompts)), label="row")
    if row == len(prompts):  # ASCII alone: every character has its token
        assert prompt_lengths(prompts, tokenizer, "data") == [len(p) for p in prompts]
        return
    foreign = data.draw(FOREIGN, label="character")
    at = data.draw(st.integers(0, len(prompts[row])), label="position")
    prompts[row] = prompts[row][:at] + foreign + prompts[row][at:]
    with pytest.raises(PreflightError) as refused:
        prompt_lengths(prompts, tokenizer, "data")
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"data row {row}: the tokenizer has no token for "
                                                      f"{foreign!r}"), message


def test_a_prompt_that_writes_the_unk_token_itself_is_taken(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    assert prompt_lengths(["a<unk>b"], tokenizer, "data") == [3]
