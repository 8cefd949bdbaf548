"""A chat template that renders a prompt without the text of one of its user or system messages (it ignores the
messages, renders only the first, nothing, or skips the system role, where data.system_prompt goes) is refused naming
the row and the message, and so is one that opens no assistant turn after the last message (it ignores
add_generation_prompt: the model would continue that message); a template that trims or wraps the text is taken.
Before, every prompt trained on the template's fixed text, on no system prompt, or on continuing the question,
silently."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from grpo_engine.data.demo_task import build_char_tokenizer
from grpo_engine.data.prompts import DataError, render_prompt

WORD = st.text(st.sampled_from("abcdefgh123+="), min_size=1, max_size=6)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]), "content": WORD})
DROPPING = {
    "ignores the messages": "Question: {% if add_generation_prompt %}Answer: {% endif %}",
    "renders the roles only": "{% for m in messages %}{{ m['role'] }}\n{% endfor %}assistant:",
    "renders the first message only": "{{ messages[0]['content'] }}\nassistant:",
    "renders nothing": "{{ '' }}",
    "skips the system role": "{% for m in messages %}{% if m['role'] != 'system' %}{{ m['role'] }}: {{ m['content'] }}"
                             "\n{% endif %}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}",
    "ignores add_generation_prompt": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
}
KEEPING = {
    "the demo's": None,
    "trims and wraps": "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] | trim }} </{{ m['role'] }}>"
                       "{% endfor %}<assistant>",
}


@settings(max_examples=80, deadline=None)
@given(messages=st.lists(MESSAGE, min_size=1, max_size=3), template=st.sampled_from(sorted({**DROPPING, **KEEPING})),
       padding=st.sampled_from(["", " ", "\n"]), system_prompt=st.none() | WORD)
def test_a_template_that_drops_a_message_or_the_answer_turn_is_refused_naming_it(messages, template, padding,
                                                                                 system_prompt):
    tokenizer = build_char_tokenizer()
    if {**DROPPING, **KEEPING}[template] is not None:
        tokenizer.chat_template = {**DROPPING, **KEEPING}[template]
    messages = [{**m, "content": padding + m["content"] + padding} for m in messages]
    if template in KEEPING:
        rendered = render_prompt(messages, tokenizer, system_prompt)
        assert all(m["content"].strip() in rendered for m in messages)
        return
    # what the engine hands the template: data.system_prompt first unless a message of the row is the system's
    given = messages if system_prompt is None or any(m["role"] == "system" for m in messages) else [
        {"role": "system", "content": system_prompt}, *messages]
    continued = given[-1]["role"] == "assistant"  # a prefill the model continues (TRL's continue_final_message)
    rendered = tokenizer.apply_chat_template(given, tokenize=False, add_generation_prompt=not continued)
    dropped = next((i for i, m in enumerate(given) if (m["role"] in ("user", "system") or
                                                        (continued and i == len(given) - 1))
                    and m["content"].strip() not in rendered), None)
    last = given[-1]["content"].strip()
    unanswered = not continued and last and rendered.rstrip().endswith(last)
    if dropped is None and not unanswered:  # what it renders holds every text, and more after the last
        try:
            assert isinstance(render_prompt(messages, tokenizer, system_prompt), str)
        except DataError as exc:  # a prefill whose text the template shows only elsewhere: transformers cannot
            # cut the prompt after it, and says so in the one line
            assert continued and "cannot render" in str(exc) and "\n" not in str(exc)
        return
    with pytest.raises(DataError) as refused:
        render_prompt(messages, tokenizer, system_prompt)
    message = str(refused.value)
    assert "\n" not in message, message
    if dropped is not None:
        assert f"message {dropped} ({given[dropped]['role']}" in message and "never see it" in message, message
    else:
        assert f"message {len(given) - 1} ({given[-1]['role']}" in message and "opens no assistant turn" in message
