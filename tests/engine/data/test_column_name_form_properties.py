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
from grpo_engine.steps.rewards import (NamedReward, RewardFunctionError, check_reward_columns,
                                      make_math_accuracy)

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


# The forms a file's one spelling of a setting's column takes beside the config's: the above, and a spreadsheet
# export's byte order mark glued to the first column's name.
FILE_FORMS = {**FORMS, "byte order mark": lambda n: "\ufeff" + n}


@SETTINGS
@given(name=st.sampled_from(NAMES), form=st.sampled_from(sorted(FILE_FORMS)),
       setting=st.sampled_from(["prompt", "answer"]))
def test_a_settings_column_held_under_a_lookalike_name_is_named(name, form, setting, tmp_path):
    """data.prompt_column (or rewards.answer_column) NFC in the config and NFD in the file, or with a byte order mark,
    a space, a zero-width space: "has no 'réponse' column (columns: ['réponse'])" listed a column that reads exactly
    as the one said missing. The look-alike is named with both names' code points."""
    wanted = unicodedata.normalize("NFC", name)
    written = FILE_FORMS[form](wanted)
    if written == wanted:
        return
    prompt_column, answer_column = (wanted, "answer") if setting == "prompt" else ("prompt", wanted)
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({("prompt" if setting == "answer" else written): "1+1=",
                                **({written: "2"} if setting == "answer" else {})}, ensure_ascii=False) + "\n",
                    encoding="utf-8")
    try:
        rows = load_prompt_rows(str(path), prompt_column, None)
        rewards = [NamedReward("math_accuracy", make_math_accuracy(1.0, 0.0, 0.0, answer_column), 1.0)]
        check_reward_columns(rewards, rows, str(path), prompt_column)
    except (DataError, RewardFunctionError) as exc:
        message = str(exc)
    else:
        raise AssertionError(f"{written!r} taken for {wanted!r}")
    assert "\n" not in message and f"the column {written!r} reads the same, written differently" in message, message
