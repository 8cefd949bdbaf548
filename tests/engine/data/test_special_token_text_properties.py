"""Property test: a tokenizer's special token written as text in what a chat template renders (a message's content,
a text prompt that data.system_prompt makes a user message, data.system_prompt itself) is refused in one line naming
the row, where and the token, before any weight loads; else the rendered prompt holds no special token id the data's
text put there. Before, a scraped `<|im_end|>` (here the built-in tokenizer's `<eos>`) in a user message was read as
the real token: the turn ended there and what followed read as another role's, silently. A plain text prompt without
a system prompt is rendered already, its special tokens the markup its author wrote: it is taken as written."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_engine.data.demo_task import build_char_tokenizer
from grpo_engine.data.prompts import DataError, render_prompts

DERANDOMIZE = bool(os.environ.get("CI"))
TOKENIZER = build_char_tokenizer()  # its chat template writes no special token of its own
SPECIAL = TOKENIZER.all_special_tokens
PIECES = st.lists(st.sampled_from(["a", "1+2=", " ", "<", ">", "eos", "|"]) | st.sampled_from(SPECIAL), min_size=1,
                  max_size=4).map("".join)
MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                           "content": PIECES | PIECES.map(lambda t: [{"type": "text", "text": t}])}),
                    min_size=1, max_size=3)


def _texts(prompt, system) -> list[str]:
    if isinstance(prompt, str):
        return [prompt] + ([system] if system is not None else [])
    contents = [m["content"] if isinstance(m["content"], str) else m["content"][0]["text"] for m in prompt]
    return contents + ([system] if system is not None else [])


@settings(max_examples=150, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(PIECES | MESSAGES, min_size=1, max_size=4), system=st.none() | PIECES)
def test_special_token_text_in_a_chat_prompt_is_refused_naming_the_row(prompts, system):
    rows = [{"prompt": p} for p in prompts]
    chat = [isinstance(p, list) or system is not None for p in prompts]
    injected = [c and any(token in text for text in _texts(p, system) for token in SPECIAL)
                for p, c in zip(prompts, chat)]
    if any(injected):
        with pytest.raises(DataError) as caught:
            render_prompts(rows, "prompt", TOKENIZER, system, "dataset 'd.jsonl'")
        message = str(caught.value)
        assert message.startswith(f"dataset 'd.jsonl' row {injected.index(True)}: "), message
        assert "holds the tokenizer's special token '<" in message and "\n" not in message, message
        return
    rendered = render_prompts(rows, "prompt", TOKENIZER, system, "dataset 'd.jsonl'")
    special_ids = set(TOKENIZER.all_special_ids)
    for text, is_chat, prompt in zip(rendered, chat, prompts):
        ids = TOKENIZER(text, add_special_tokens=False)["input_ids"]
        assert not is_chat or not special_ids & set(ids), (prompt, text)
        assert is_chat or text == prompt  # a rendered text prompt is taken as written
