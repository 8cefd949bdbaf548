"""Chat prompts as a dataset file may hold them: messages with misspelt or unknown roles ("sytem", "tool_output"),
content that is missing, null, a number, an object or a list of non-text parts, keys of another format. Each loads
as the chat format the engine follows, or the load stops in one line naming the file, the row, the message and the
roles accepted, before any tokenizer or model (hypothesis). Before, the chat template decided: most render an
unknown role under no header, or drop it, silently."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.data.chat_messages import OPTIONAL_KEYS, ROLES, conversation_problem
from grpo_engine.data.prompts import DataError, load_prompt_rows, prompt_chars

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

MISSING = object()
ROLE_VALUES = st.one_of(st.sampled_from(ROLES), st.sampled_from(["sytem", "tool_output", "User", "assistant ", "",
                                                                  "function", "ipython", "developer", "human", "bot"]),
                        st.text(max_size=6), st.none(), st.integers(), st.just(MISSING), st.just(["user"]))
TEXT_PART = st.builds(lambda t: {"type": "text", "text": t}, st.text(min_size=1, max_size=5))
ODD_PART = st.one_of(st.just({"type": "image", "url": "x.png"}), st.just({"type": "text"}),
                     st.just({"type": "text", "text": 3}), st.just({"text": "hi"}), st.just("plain"), st.none(),
                     st.just({"type": "text", "text": "a", "cache": True}))
CONTENT_VALUES = st.one_of(st.text(min_size=1, max_size=8), st.lists(TEXT_PART, min_size=1, max_size=2),
                           st.lists(st.one_of(TEXT_PART, ODD_PART), min_size=1, max_size=3), st.none(), st.integers(),
                           st.floats(allow_nan=False, allow_infinity=False), st.booleans(), st.just({"text": "x"}),
                           st.just(MISSING))
EXTRA_KEYS = st.dictionaries(st.sampled_from([*OPTIONAL_KEYS, "contnet", "rol", "weight", "metadata"]),
                             st.one_of(st.text(max_size=3), st.lists(st.integers(), max_size=1)), max_size=1)


@st.composite
def messages(draw):
    message = dict(draw(EXTRA_KEYS))
    role, content = draw(ROLE_VALUES), draw(CONTENT_VALUES)
    if role is not MISSING:
        message["role"] = role
    if content is not MISSING:
        message["content"] = content
    return message


def _accepted(message) -> bool:
    """An independent statement of the chat format the engine follows."""
    if message.get("role") not in ROLES or isinstance(message.get("role"), list) or "content" not in message:
        return False
    if set(message) - {"role", "content", *OPTIONAL_KEYS}:
        return False
    content = message["content"]
    if isinstance(content, list):
        return all(isinstance(p, dict) and set(p) == {"type", "text"} and p["type"] == "text"
                   and isinstance(p["text"], str) for p in content)
    return isinstance(content, str) or (content is None and bool(message.get("tool_calls")))


@SETTINGS
@given(prompts=st.lists(st.lists(messages(), min_size=1, max_size=3), min_size=1, max_size=3))
def test_chat_messages_load_as_the_chat_format_or_one_line_names_the_row_and_roles(prompts, tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"prompt": prompt, "answer": "2"}) + "\n" for prompt in prompts))
    accepted = [all(map(_accepted, prompt)) for prompt in prompts]
    try:
        rows = load_prompt_rows(str(path), "prompt", None)
    except DataError as exc:
        message = str(exc)
        assert "\n" not in message and str(path) in message and len(message) < 400, message
        bad_row = int(message.split(" row ")[1].split(":")[0])
        if not accepted[bad_row]:  # named: the first row whose messages are outside the format
            assert bad_row == accepted.index(False), message
            assert "message " in message, message
            if "role" in message and "the key" not in message:
                assert all(role in message for role in ROLES), message
        else:  # a row of well-formed messages is refused only for having no text at all, a blank user message
            # or a system message last (test_chat_turn_properties draws those)
            prompt = prompts[bad_row]
            assert ("is empty" in message and prompt_chars(prompt) == 0 or conversation_problem(prompt) is not None
                    and conversation_problem(prompt) in message), message
        return
    assert all(accepted), prompts
    assert [row["prompt"] for row in rows] == prompts
