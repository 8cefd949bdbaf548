"""A text prompt that is a list of chat messages encoded as text: json.dumps of the list, or str() of it (a messages
column saved through pandas' to_csv or a Parquet export of strings; ShareGPT's {'from', 'value'} messages, a tuple,
one JSON message a line, behind a byte order mark too). It loaded as a plain-text prompt, so the model
trained on brackets, quotes and role names, silently; it is now refused in one line naming the row and the encoding,
and text that merely starts with a bracket still loads (hypothesis draws both)."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.data.prompts import DataError, load_prompt_rows

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                 "content": st.text(alphabet="ab 1+?'\"[]{}", min_size=1, max_size=8)})
# how the messages became text -> the words the refusal names it by; one message alone and a list through json.dumps
# twice loaded as text prompts before
SHAREGPT_ROLES = {"system": "system", "user": "human", "assistant": "gpt"}


def _sharegpt(messages: list[dict]) -> list[dict]:
    return [{"from": SHAREGPT_ROLES[m["role"]], "value": m["content"]} for m in messages]


ENCODINGS = {"JSON": json.dumps, "a Python list": str, "JSON (one message)": lambda m: json.dumps(m[0]),
             "a Python dict (one message)": lambda m: str(m[0]),
             "JSON, itself in a JSON string": lambda m: json.dumps(json.dumps(m)),
             # ShareGPT's {'from', 'value'}, a tuple's str(), one JSON message a line: loaded as text before
             "JSON ": lambda m: json.dumps(_sharegpt(m)), "a Python list ": lambda m: str(tuple(m)),
             "JSON lines (one message a line)": lambda m: "\n".join(json.dumps(x) for x in m + m)}
# around the text: spaces and line breaks, and what shows nothing (a byte order mark, U+200B) that str.strip keeps
PADDING = st.sampled_from(["", " ", "\n", " \n ", "\ufeff", "\u200b "])
# Text a prompt may be that starts and ends with a bracket, or names a role, and is no list of messages.
PLAIN = st.one_of(st.lists(st.integers(), min_size=1).map(str), st.just("[role] Answer the question."),
                  st.just("[1, 2] + [3] = ?"), st.lists(st.fixed_dictionaries({"name": st.text(max_size=3)}),
                                                      min_size=1).map(json.dumps),
                  st.just('[{"role": "user", "content": "hi"}'), st.just("[] role []"))


def _load(tmp_path, prompts: list[str]):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": prompt}) + "\n" for prompt in prompts))
    return load_prompt_rows(str(path), "prompt", None)


@SETTINGS
@given(messages=st.lists(MESSAGE, min_size=1, max_size=3), encoding=st.sampled_from(sorted(ENCODINGS)),
       padding=PADDING, plain=st.lists(PLAIN, max_size=2), in_a_message=st.booleans())
def test_messages_written_as_text_are_refused_naming_the_row_and_the_encoding(messages, encoding, padding, plain,
                                                                              in_a_message, tmp_path):
    """The text is the prompt, or the text of a user message of a chat prompt (a nested export)."""
    encoded = padding + ENCODINGS[encoding](messages) + padding
    try:
        _load(tmp_path, [*plain, [{"role": "user", "content": encoded}] if in_a_message else encoded])
    except DataError as exc:
        message = str(exc)
        assert "\n" not in message and f" row {len(plain)}: " in message, message
        assert f"chat messages written as {encoding.strip()}" in message, message
        return
    raise AssertionError(f"{encoded!r} loaded as a text prompt")


@SETTINGS
@given(plain=st.lists(PLAIN, min_size=1, max_size=3))
def test_text_that_only_looks_like_a_list_loads(plain, tmp_path):
    assert [row["prompt"] for row in _load(tmp_path, plain)] == plain
