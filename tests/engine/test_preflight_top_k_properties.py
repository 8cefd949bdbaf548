"""rollout.top_k at least the tokens the model samples from (its config.json rows, less the padded rows past the
tokenizer's last token unless rollout.sample_padded_vocab) keeps every token: refused in one line naming the key
before any weight loads, by `train`'s pre-flight and by `eval`; any smaller top_k passes (hypothesis). Before, it
was taken without a word, and training recorded and replayed every position's kept set at the width of the whole
vocabulary (on a 152k-token model about 20 GB of ids for 64 completions of 256 tokens)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import main
from grpo_engine.config import load_config
from grpo_engine.preflight import PreflightError, preflight
from grpo_engine.tools import evaluate
from model_variants import model_variant

TOKENS = 99  # the tiny model's character tokenizer
PADDED_ROWS = (0, 7, 29)
ROWS = [{"prompt": "1+2=", "answer": "3"}]


@pytest.fixture(scope="module")
def padded_models(tiny_model_dir, tmp_path_factory):
    """The tiny model declaring `pad` more embedding rows than its tokenizer has tokens (as Qwen2.5 does)."""
    root = tmp_path_factory.mktemp("padded")
    return {pad: model_variant(tiny_model_dir, root / f"pad{pad}", vocab_size=TOKENS + pad)[0] for pad in PADDED_ROWS}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pad=st.sampled_from(PADDED_ROWS), padded=st.booleans(),
       top_k=st.integers(0, 3 * TOKENS) | st.sampled_from([TOKENS - 1, TOKENS, TOKENS + 1, 2**31 - 1]))
def test_a_top_k_keeping_every_token_is_refused_before_weights_load(pad, padded, top_k, padded_models, tmp_path):
    config = load_config(overrides={"rollout.top_k": top_k, "rollout.sample_padded_vocab": padded,
                                    "rollout.max_new_tokens": 8, "run.output_dir": str(tmp_path / "run")})
    sampled = TOKENS + pad if padded else TOKENS
    try:
        preflight(config, ROWS, [], padded_models[pad])
    except PreflightError as exc:
        message = str(exc)
        assert 0 < top_k and top_k >= sampled, message
        assert "\n" not in message and f"rollout.top_k ({top_k})" in message and f"{sampled} tokens" in message
        return
    assert top_k == 0 or top_k < sampled, (top_k, sampled)


class WeightsLoading(Exception):
    pass


@pytest.mark.parametrize("top_k, refused", [(TOKENS - 1, False), (TOKENS, True), (10**6, True)])
def test_eval_refuses_it_before_the_model_loads(top_k, refused, tiny_model_dir, monkeypatch, capsys):
    def loading(*args, **kwargs):
        raise WeightsLoading

    monkeypatch.setattr(evaluate, "load_eval_model", loading)
    argv = ["eval", "--model", str(tiny_model_dir), "--sample", "--rollout.top_k", str(top_k)]
    if not refused:
        with pytest.raises(WeightsLoading):
            main(argv)
        return
    assert main(argv) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"rollout.top_k ({top_k}) is at least the {TOKENS} tokens" in err[0], err
