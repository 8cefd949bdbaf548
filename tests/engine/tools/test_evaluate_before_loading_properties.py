"""`grpo-engine eval` against a model whose config.json declares fewer positions than a prompt plus
rollout.max_new_tokens needs, or a vocabulary its tokenizer's ids pass: refused in one line naming the row (or the
model directory) before the model's weights load; anything that fits gets as far as loading (hypothesis). Before,
both were found only after the weights had loaded (check_prompts_fit and check_tokenizer_fits on the loaded model)."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import main
from grpo_engine.tools import evaluate
from model_variants import model_variant


class WeightsLoading(Exception):
    pass


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt_chars=st.lists(st.integers(1, 40), min_size=1, max_size=4), new_tokens=st.integers(1, 40),
       positions=st.integers(8, 80), truncate=st.none() | st.integers(1, 30), added=st.integers(0, 1))
def test_eval_refuses_what_the_model_config_cannot_take_before_loading_weights(
        prompt_chars, new_tokens, positions, truncate, added, tiny_model_dir, tmp_path_factory, monkeypatch, capsys):
    root = tmp_path_factory.mktemp("eval")
    model, tokens = model_variant(tiny_model_dir, root / "m", positions=positions, added=added)
    data = root / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": "1" * n, "answer": "1"}) + "\n" for n in prompt_chars))

    def loading(*args, **kwargs):
        raise WeightsLoading

    monkeypatch.setattr(evaluate, "load_eval_model", loading)
    argv = ["eval", "--model", model, "--data", str(data), "--rollout.max_new_tokens", str(new_tokens),
            *(["--data.max_prompt_length", str(truncate)] if truncate else [])]
    try:
        outcome = main(argv)
    except WeightsLoading:
        outcome = "loading"
    lines = capsys.readouterr().err.splitlines()
    longest = max(prompt_chars) if truncate is None else min(max(prompt_chars), truncate)  # one token a character
    fits = longest + new_tokens <= positions and tokens <= 99
    if fits:
        assert outcome == "loading", lines
        return
    assert outcome != "loading" and len(lines) == 1, (outcome, lines)
    if tokens > 99:
        assert f"the tokenizer in {model!r} has {tokens} tokens" in lines[0], lines
    else:
        assert f"dataset {str(data)!r} row {prompt_chars.index(max(prompt_chars))}" in lines[0], lines
        assert f"max_position_embeddings ({positions})" in lines[0], lines
