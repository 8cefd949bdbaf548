"""Column names that are the same text in two Unicode normalizations (`é` as U+00E9 in some rows, e + U+0301 in
others: macOS tools, editors and merged exports write either), or with fullwidth letters, a space after it or a
zero-width space inside it (which loaded as two columns before). They look the same in every message: a reward
function reading one met rows "without" it, and the refusal listed a column of that very name. Now the load stops
in one line naming both and the rows they first appear in (hypothesis draws the names and the rows)."""

from __future__ import annotations

import json
import unicodedata

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.data.prompts import DataError, load_prompt_rows

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
NAMES = ["réponse", "Ångström", "naïve", "answer", "año"]
# How one name is written in a row: its Unicode form, fullwidth letters (an East Asian keyboard), a space after it
# or a zero-width one inside it (copied from a web page): each reads the same as the others on screen.
FORMS = {"composed": lambda n: unicodedata.normalize("NFC", n), "decomposed": lambda n: unicodedata.normalize("NFD", n),
         "fullwidth": lambda n: "".join(chr(ord(c) + 0xFEE0) if c.isascii() and c.isalpha() else c for c in n),
         "trailing space": lambda n: n + " ", "zero-width inside": lambda n: n[:1] + "\u200b" + n[1:]}


@SETTINGS
@given(columns=st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(sorted(FORMS))), min_size=1, max_size=4))
def test_a_column_name_in_two_unicode_forms_is_refused_naming_both(columns, tmp_path):
    """Row i holds the i-th drawn (name, form) as a column next to its prompt."""
    written = [FORMS[form](name) for name, form in columns]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": "1+1=", column: "2"}, ensure_ascii=False) + "\n"
                            for column in written), encoding="utf-8")
    names = [unicodedata.normalize("NFC", name) for name, _ in columns]
    seen: dict[str, str] = {}
    clash = None
    for i, column in enumerate(written):
        first = seen.setdefault(names[i], column)
        if first != column and clash is None:
            clash = (written.index(first), i)
    try:
        rows = load_prompt_rows(str(path), "prompt", None)
    except DataError as exc:
        message = str(exc)
        assert clash is not None, message
        assert "\n" not in message and "read as the same name" in message, message
        assert f"(row {clash[0]})" in message and f"(row {clash[1]})" in message, message
        return
    assert clash is None, written
    assert [next(k for k in row if k != "prompt") for row in rows] == written
