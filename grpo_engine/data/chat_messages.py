"""What a chat prompt (a list of messages) may hold, checked when the data loads, before any tokenizer or model.

A chat template is code the model's authors wrote: given a role it does not know ("sytem", "tool_output") most
templates render the message under no header, or drop it, silently; a message without text content renders as
"None" or nothing. So the engine accepts the roles of the chat format it follows (OpenAI's, which transformers'
templates implement) and content that is text, or a list of text parts, and refuses anything else in one line
naming the file, the row, the message and what was expected.
"""

from __future__ import annotations

import ast
import json
import unicodedata
from typing import Any, Optional

ROLES = ("system", "user", "assistant", "tool")
# Keys a message may hold besides its role and content (a tool call's, the speaker's name); any other key is a
# misspelling or another format's field, which a template would ignore.
OPTIONAL_KEYS = ("name", "tool_calls", "tool_call_id")


def _part_problem(part: Any) -> Optional[str]:
    if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
        return f"a content part {part!r:.60} that is not {{'type': 'text', 'text': text}} (the engine trains on text)"
    extra = sorted(set(part) - {"type", "text"})
    return f"a content part with the key {extra[0]!r}, not one of 'type', 'text'" if extra else None


def message_problem(message: Any) -> Optional[str]:
    """What is wrong with one chat message, in a few words, or None."""
    if not isinstance(message, dict):
        return f"is {type(message).__name__} {message!r:.40}, not an object {{'role', 'content'}}"
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:
        found = "no role" if "role" not in message else f"the role {role!r:.40}"
        return f"has {found}, not one of {', '.join(ROLES)}"
    if "content" not in message:
        return "has no 'content'"
    content = message["content"]
    if isinstance(content, list):
        problem = next((p for p in map(_part_problem, content) if p), None)
        if problem:
            return f"has {problem}"
    elif not isinstance(content, str) and not (content is None and message.get("tool_calls")):
        return f"has content {content!r:.40} ({type(content).__name__}), not text or a list of text parts"
    extra = sorted(set(message) - {"role", "content", *OPTIONAL_KEYS}, key=str)
    if extra:
        return f"has the key {extra[0]!r:.40}, not one of role, content, {', '.join(OPTIONAL_KEYS)}"
    return None


def messages_problem(messages: list[Any]) -> Optional[str]:
    """The first message of `messages` that is not a chat message the engine accepts, named by its index."""
    for index, message in enumerate(messages):
        problem = message_problem(message)
        if problem:
            return f"message {index} {problem}"
    return None


# What shows nothing: spaces and separators (Z*), control characters (Cc: tab, newline) and format characters (Cf:
# U+200B zero-width space, U+FEFF, U+2060 word joiner): a prompt of only these reads as blank to a person, and the
# model gets a turn with nothing to answer. Combining marks (Mn, Me: U+034F, the variation selectors U+FE00-U+FE0F)
# show only on a character before them, and a few letters and symbols are drawn as nothing at all: the Hangul
# fillers (letters, the usual "invisible name" characters) and the braille blank.
_INVISIBLE = ("Zs", "Zl", "Zp", "Cc", "Cf", "Mn", "Me")
BLANK_GLYPHS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
BLANK = "only whitespace or invisible characters such as U+200B or U+3164"


def shows(character: str) -> bool:
    """Whether one character is drawn as something on its own."""
    return character not in BLANK_GLYPHS and unicodedata.category(character) not in _INVISIBLE


def visible(text: str) -> bool:
    """Whether `text` holds a character that shows (str.strip keeps U+200B, U+FEFF, U+2060, U+3164)."""
    return any(map(shows, text))


def conversation_problem(messages: list[dict[str, Any]]) -> Optional[str]:
    """What makes well-formed messages (messages_problem found none) no prompt to answer, in a few words, or None:
    a user message with no visible text (the model answers a blank turn), a system message last (TRL refuses it: no
    turn to answer and no assistant message to continue), or a blank assistant message last (a prefill of nothing)."""
    for index, message in enumerate(messages):
        if message["role"] == "user" and not visible(content_text(message["content"])):
            return f"message {index} (user) is empty ({BLANK}); write its text or drop the row"
    last = len(messages) - 1
    if messages and messages[-1]["role"] == "system":
        return (f"its last message ({last}) is a system message, which leaves the model nothing to answer; end it "
                f"with a user or tool message (or an assistant message for the model to continue)")
    if continues_final_message(messages) and not visible(content_text(messages[-1]["content"])):
        return (f"its last message ({last}) is an assistant message with no visible text, which the model would "
                f"continue as its answer; drop it, and the model answers the turn before")
    return None


def _is_message(value: Any) -> bool:
    """A dict written as one chat message: {'role', 'content'} (OpenAI's, TRL's) or {'from', 'value'} (ShareGPT's)."""
    return isinstance(value, dict) and ("role" in value and "content" in value or "from" in value and "value" in value)


def _strip_unseen(text: str) -> str:
    """`text` without what shows nothing at either end (str.strip keeps a byte order mark, U+200B)."""
    start, end = 0, len(text)
    while start < end and not shows(text[start]):
        start += 1
    while end > start and not shows(text[end - 1]):
        end -= 1
    return text[start:end]


def messages_written_as_text(text: str) -> Optional[str]:
    """How a text prompt encodes chat messages ('JSON', 'a Python list'), or None. A messages column saved through a
    table (pandas' to_csv, a Parquet export of str() of each list) reaches the data as text; the model was trained on
    its brackets, quotes and role names as the prompt, silently. One message alone ({'role', 'content'}) and a list
    passed through json.dumps twice (a JSON string of the JSON text) are the same mistake; so are ShareGPT's
    {'from', 'value'} messages, a tuple's str(), one JSON message a line, and any of them behind a byte order mark."""
    stripped = _strip_unseen(text)
    if "role" not in stripped and "from" not in stripped:
        return None
    if stripped.startswith('"'):  # json.dumps of the JSON text: decoded once, it is the list as text
        try:
            inner = json.loads(stripped)
        except ValueError:
            return None
        kind = messages_written_as_text(inner) if isinstance(inner, str) and inner.strip() != stripped else None
        return f"{kind}, itself in a JSON string" if kind else None
    if stripped[:1] + stripped[-1:] not in ("[]", "{}", "()"):
        return None
    for kind, parse in (("JSON", json.loads), ("a Python list (str() of one)", ast.literal_eval)):
        try:
            value = parse(stripped)
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):  # not that kind of text
            continue
        if _is_message(value):  # one message
            return f"{kind.split(' (')[0].replace('list', 'dict')} (one message)"
        if isinstance(value, (list, tuple)) and value and all(_is_message(m) or isinstance(m, dict) and "role" in m
                                                              for m in value):
            return kind
    lines = [line for line in stripped.splitlines() if line.strip()]
    if len(lines) > 1 and all(_is_message(_json_or_none(line)) for line in lines):
        return "JSON lines (one message a line)"
    return None


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def message_written_as_text(messages: list[dict[str, Any]]) -> Optional[str]:
    """The first message whose text is itself chat messages as text (messages_written_as_text), in a few words."""
    for index, message in enumerate(messages):
        kind = messages_written_as_text(content_text(message["content"]))
        if kind:
            return f"message {index} ({message['role']}) holds chat messages written as {kind} as its text"
    return None


def continues_final_message(messages: list[dict[str, Any]]) -> bool:
    """Whether the model continues the last message (an assistant message: a prefilled start of the answer), as
    TRL renders it (continue_final_message), rather than starting a turn of its own after it (a generation
    prompt after a user or tool message)."""
    return bool(messages) and messages[-1].get("role") == "assistant"


def own_system_message_rows(rows: list[dict[str, Any]], column: str) -> list[int]:
    """The rows whose prompt is chat messages holding a system message of their own: data.system_prompt is not
    added to those (the row's own is kept)."""
    return [i for i, row in enumerate(rows) if isinstance(row.get(column), list)
            and any(isinstance(m, dict) and m.get("role") == "system" for m in row[column])]


def unused_system_prompt(rows: list[dict[str, Any]], column: str, source: str) -> Optional[str]:
    """What data.system_prompt (when set) is not added to, in one line, or None: it used to be dropped without a
    word for chat prompts with their own system message, even when that was every prompt."""
    own = own_system_message_rows(rows, column)
    if not own:
        return None
    if len(own) == len(rows):
        each = "its one prompt" if len(rows) == 1 else f"each of its {len(rows)} prompts"
        return (f"data.system_prompt changes nothing for {source}: {each} is chat messages with its own system "
                f"message, which is kept")
    return (f"data.system_prompt is not added to {len(own)} of the {len(rows)} prompts of {source} (row {own[0]} "
            f"first): they are chat messages with their own system message, which is kept")


def content_text(content: Any) -> str:
    """A message's text: its content, or its text parts joined (message_problem decides what else is refused)."""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict)
                       and isinstance(part.get("text"), str))
    return content if isinstance(content, str) else ""


def special_token_as_text(messages: list[Any], system_prompt: Optional[str],
                          special_tokens: list[str]) -> Optional[str]:
    """Where a tokenizer's special token (`<|im_end|>`, `<|eot_id|>`, `</s>`) is written as text in what a chat
    template renders (a message's content, or data.system_prompt), in a few words, or None. The template puts the
    text between its own markup and the tokenizer then reads the token as the real one: a scraped `<|im_end|>` in a
    user message ended the turn there, and what followed read as another role's, silently."""
    tokens = [token for token in special_tokens if isinstance(token, str) and token.strip()]
    texts = [("data.system_prompt", system_prompt or "")]
    texts += [(f"message {i} ({m.get('role')})" if "role" in m else "the prompt", content_text(m.get("content")))
              for i, m in enumerate(messages) if isinstance(m, dict)]
    for where, text in texts:
        token = next((token for token in tokens if token in text), None)
        if token is not None:
            return f"{where} holds the tokenizer's special token {token!r} as text"
    return None


def dropped_message(messages: list[Any], rendered: Any) -> Optional[str]:
    """The user or system message whose text (stripped: templates trim) a chat template's output lacks, or a final
    assistant message the model is to continue, in a few words, or None. A template that ignores the messages
    (renders a fixed header) or only the first of them trained every prompt on the same text, silently; one that
    skips the system role dropped data.system_prompt (the run's instructions) as silently. Other assistant turns
    are not judged: templates may rightly drop their parts (the reasoning of earlier turns)."""
    if not isinstance(rendered, str):
        return "any text (it returned no string)"
    continued = len(messages) - 1 if continues_final_message(messages) else None
    for index, message in enumerate(messages):
        text = content_text(message.get("content")).strip() if isinstance(message, dict) else ""
        if text and (message.get("role") in ("user", "system") or index == continued) and text not in rendered:
            return f"the text of message {index} ({message.get('role')}, {text!r:.40})"
    return None


def missing_assistant_turn(messages: list[Any], rendered: str) -> Optional[str]:
    """The last message, in a few words, when what the template rendered for generation ends with its text: the
    template opened no assistant turn after it (it ignores add_generation_prompt), so the model would write more of
    that message, not an answer to it; or None. A final assistant message is continued on purpose
    (continues_final_message): its text ends the prompt."""
    if continues_final_message(messages):
        return None
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    text = content_text(last.get("content")).strip()
    if text and rendered.rstrip().endswith(text):
        return f"message {len(messages) - 1} ({last.get('role')}, {text[-40:]!r})"
    return None
