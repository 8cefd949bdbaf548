"""Property test: data.system_prompt is added to every prompt it can be, and the prompts it is not added to (chat
messages holding their own system message, which is kept) are said in one warning when the data loads, naming the
file, how many and the first row. Before, it was dropped without a word, even when that was every prompt: the
setting then changed nothing."""

from __future__ import annotations

import json
import logging
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_engine.data.demo_task import build_char_tokenizer
from grpo_engine.data.prompts import load_prompt_rows, render_prompt

DERANDOMIZE = bool(os.environ.get("CI"))
SYSTEM = "Be brief."
TEXT = st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=5)
PROMPTS = st.one_of(
    TEXT,
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": TEXT}), min_size=1,
             max_size=2),
    st.tuples(TEXT, TEXT).map(lambda p: [{"role": "system", "content": p[0]}, {"role": "user", "content": p[1]}]))
TOKENIZER = build_char_tokenizer()


@settings(max_examples=80, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(PROMPTS, min_size=1, max_size=5), system=st.sampled_from([SYSTEM, None]))
def test_the_prompts_a_system_prompt_is_not_added_to_are_said(prompts, system, tmp_path, caplog):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="grpo_engine"):
        load_prompt_rows(str(path), "prompt", None, system_prompt=system)
    warnings = [r.getMessage() for r in caplog.records if "data.system_prompt" in r.getMessage()]
    own = [i for i, p in enumerate(prompts) if isinstance(p, list) and p[0]["role"] == "system"]
    if system is None or not own:
        assert warnings == []
    else:
        assert len(warnings) == 1 and "\n" not in warnings[0], warnings
        each = "its one prompt" if len(prompts) == 1 else f"each of its {len(prompts)} prompts"
        expected = (f"changes nothing for dataset '{path}': {each} is chat" if len(own) == len(prompts)
                    else f"is not added to {len(own)} of the {len(prompts)} prompts of dataset '{path}' (row {own[0]} ")
        assert warnings[0].startswith("warning: data.system_prompt ") and expected in warnings[0], warnings[0]
    if system is not None:  # what the warning says is what rendering does
        for i, prompt in enumerate(prompts):
            assert (f"system: {SYSTEM}" in render_prompt(prompt, TOKENIZER, system)) == (i not in own)
