"""A prompt the model can answer: text that shows, and chat messages whose last turn is one to answer or continue.

Before, a text prompt of zero-width characters (U+200B, U+FEFF, U+2060: `str.strip` keeps them) loaded as a prompt,
and so did one of Hangul fillers (U+3164), the braille blank or a lone combining mark,
and so did chat messages whose user message was blank or whose last message was a system message: the model
answered a turn with nothing in it. A prompt ending with an assistant message (a prefilled start of the answer) got
a generation prompt after it, so the model started a new turn instead of continuing the prefill as TRL renders it.
Now each blank or unanswerable prompt stops the load in one line naming the row (and the message), and a prefill
is continued (hypothesis draws the texts and the conversations).
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.data.demo_task import build_char_tokenizer
from grpo_engine.data.prompts import DataError, load_prompt_rows, render_prompt

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# What shows nothing, written out here rather than taken from the code under test.
INVISIBLE = " \t\n\r\x0b\x0c\u00a0\u1680\u2000\u2007\u200a\u2028\u2029\u202f\u205f\u3000\u200b\u200c\u200d\u2060\ufeff\u00ad"
# ... and letters, symbols and marks drawn as nothing: the Hangul fillers, the braille blank, the combining grapheme
# joiner and variation selectors alone (these loaded as prompts before)
INVISIBLE += "\u115f\u1160\u3164\uffa0\u2800\u034f\ufe0f\ufe00\u0301"
SHOWN = "ab1+=?é中"
BLANK_TEXT = st.text(alphabet=INVISIBLE, min_size=1, max_size=6)
SHOWN_TEXT = st.builds(lambda before, char, after: before + char + after, st.text(alphabet=INVISIBLE, max_size=3),
                       st.sampled_from(SHOWN), st.text(alphabet=INVISIBLE + SHOWN, max_size=4))
TEXT = st.one_of(BLANK_TEXT, SHOWN_TEXT)


def _shows(text: str) -> bool:
    return any(character not in INVISIBLE for character in text)


def _load(tmp_path, prompts: list) -> list:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": prompt}) + "\n" for prompt in prompts), encoding="utf-8")
    return load_prompt_rows(str(path), "prompt", None)


def _refusal(tmp_path, prompts: list) -> str | None:
    try:
        _load(tmp_path, prompts)
    except DataError as exc:
        message = str(exc)
        assert "\n" not in message and "Traceback" not in message and len(message) < 400, message
        return message
    return None


@SETTINGS
@given(texts=st.lists(TEXT, min_size=1, max_size=4))
def test_a_text_prompt_loads_only_when_some_of_it_shows(texts, tmp_path):
    message = _refusal(tmp_path, texts)
    blank = [i for i, text in enumerate(texts) if not _shows(text)]
    if not blank:
        assert message is None, message
        return
    assert message is not None and f" row {blank[0]}: " in message and "is empty" in message, (texts, message)


CONVERSATION = st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", "tool"]), TEXT), min_size=1,
                        max_size=4)


def _expected_refusal(turns: list[tuple[str, str]]) -> str | None:
    """The independent rule: every user message shows some text, and the last message is not a system message nor
    an assistant message that shows nothing."""
    blank_user = next((i for i, (role, text) in enumerate(turns) if role == "user" and not _shows(text)), None)
    if blank_user is not None:
        return f"message {blank_user} (user) is empty"
    last_role, last_text = turns[-1]
    if last_role == "system":
        return f"its last message ({len(turns) - 1}) is a system message"
    if last_role == "assistant" and not _shows(last_text):
        return f"its last message ({len(turns) - 1}) is an assistant message with no visible text"
    return None


@SETTINGS
@given(turns=CONVERSATION)
def test_chat_messages_load_when_the_model_has_a_turn_to_answer(turns, tmp_path):
    prompt = [{"role": role, "content": text} for role, text in turns]
    message = _refusal(tmp_path, [prompt])
    expected = _expected_refusal(turns)
    if expected is None:
        assert message is None, message
    else:
        assert message is not None and " row 0: " in message and expected in message, (turns, message)


@SETTINGS
@given(turns=CONVERSATION, system_prompt=st.one_of(st.none(), SHOWN_TEXT))
def test_a_final_assistant_message_is_continued_and_any_other_gets_a_turn(turns, system_prompt):
    """The built-in chat template writes `role: content` lines and `assistant: ` as its generation prompt."""
    messages = [{"role": role, "content": text} for role, text in turns]
    if _expected_refusal(turns) is not None:
        return
    rendered = render_prompt(messages, build_char_tokenizer(), system_prompt)
    shown = ([("system", system_prompt)] if system_prompt is not None and all(role != "system" for role, _ in turns)
             else []) + turns
    head = "".join(f"{role}: {text}\n" for role, text in shown[:-1]) + f"{turns[-1][0]}: "
    if turns[-1][0] == "assistant":  # the prefill ends the prompt (the template's newline after it cut; trailing
        # whitespace may go with it, as transformers cuts), so the model goes on from its last character
        assert rendered in (head + turns[-1][1], head + turns[-1][1].rstrip()), (turns, rendered)
    else:
        assert rendered == head + turns[-1][1] + "\nassistant: ", (turns, rendered)
