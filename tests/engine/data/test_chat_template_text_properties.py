"""A chat template that renders a prompt without the text of one of its user messages (it ignores the messages,
renders only the first, or nothing) is refused naming the row and the message; a template that trims or wraps the
text is taken. Before, every prompt trained on the template's fixed text, silently."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from grpo_engine.data.demo_task import build_char_tokenizer
from grpo_engine.data.prompts import DataError, render_prompt

WORD = st.text(st.sampled_from("abcdefgh123+="), min_size=1, max_size=6)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": WORD})
DROPPING = {
    "ignores the messages": "Question: {% if add_generation_prompt %}Answer: {% endif %}",
    "renders the roles only": "{% for m in messages %}{{ m['role'] }}\n{% endfor %}assistant:",
    "renders the first message only": "{{ messages[0]['content'] }}\nassistant:",
    "renders nothing": "{{ '' }}",
}
KEEPING = {
    "the demo's": None,
    "trims and wraps": "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] | trim }} </{{ m['role'] }}>"
                       "{% endfor %}<assistant>",
}


@settings(max_examples=60, deadline=None)
@given(messages=st.lists(MESSAGE, min_size=1, max_size=3), template=st.sampled_from(sorted({**DROPPING, **KEEPING})),
       padding=st.sampled_from(["", " ", "\n"]))
def test_a_template_that_drops_a_user_message_is_refused_naming_it(messages, template, padding):
    tokenizer = build_char_tokenizer()
    if {**DROPPING, **KEEPING}[template] is not None:
        tokenizer.chat_template = {**DROPPING, **KEEPING}[template]
    messages = [{**m, "content": padding + m["content"] + padding} for m in messages]
    rendered = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    if template in KEEPING:
        assert all(m["content"].strip() in render_prompt(messages, tokenizer, None) for m in messages)
        return
    # the user messages, and a final assistant message (a prefill the model continues)
    kept = [i for i, m in enumerate(messages) if m["role"] == "user" or i == len(messages) - 1]
    dropped = next((i for i in kept if messages[i]["content"].strip() not in
                    tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=messages[-1]["role"] != "assistant")), None)
    if dropped is None:  # no user message, or what it renders happens to hold every user text
        try:
            assert isinstance(render_prompt(messages, tokenizer, None), str)
        except DataError as exc:  # a prefill whose text the template shows only elsewhere: transformers cannot
            # cut the prompt after it, and says so in the one line
            assert messages[-1]["role"] == "assistant" and "cannot render" in str(exc) and "\n" not in str(exc)
        return
    with pytest.raises(DataError) as refused:
        render_prompt(messages, tokenizer, None)
    message = str(refused.value)
    role = messages[dropped]["role"]
    assert "\n" not in message and f"message {dropped} ({role}" in message and "never see it" in message, rendered
