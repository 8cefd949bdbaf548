"""A vLLM server's completion answers that parse but break what the request asked (token ids past the run's
vocabulary or not token_id:N, log-probs NaN, infinite, positive, null or not numbers, fewer or more log-probs than
tokens, no token or more than max_tokens, other than the one choice asked): each drawn case is one line naming the
server and the field, before a batch is built. Before: most became a batch without a word (an out-of-vocabulary id,
a null log-prob read as 0, a NaN in the importance ratio, a completion longer than rollout.max_new_tokens, a
dropped second choice), the rest a tensor size error or an int() overflow naming nothing. A well-formed answer
gives exactly its ids and log-probs."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_engine.config import load_config
from grpo_engine.rollout.http_client import ServerAnswerError
from grpo_engine.rollout.server import VLLMServerRollout
from tests.support import misbehaving_server as servers
from tests.support.server_models import save_model

MAX_NEW_TOKENS = 6


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = save_model(tmp_path_factory.mktemp("answers_model"))
    lm = AutoModelForCausalLM.from_pretrained(path)
    return path, lm, AutoTokenizer.from_pretrained(path)


@st.composite
def completions(draw, vocab: int):
    """(token strings, log-probs, what breaks them or None)."""
    length = draw(st.integers(1, MAX_NEW_TOKENS))
    tokens = [f"token_id:{t}" for t in draw(st.lists(st.integers(0, vocab - 1), min_size=length, max_size=length))]
    logprobs = draw(st.lists(st.floats(-60.0, 0.0), min_size=length, max_size=length))
    fault = draw(st.sampled_from([None, "id past vocab", "not an id", "bad log-prob", "log-probs count", "too long",
                                  "empty", "choices"]))
    at = draw(st.integers(0, length - 1))
    if fault == "id past vocab":
        tokens[at] = f"token_id:{draw(st.integers(vocab, 2**80))}"
    elif fault == "not an id":
        tokens[at] = draw(st.sampled_from(["token_id:-1", "token_id:1.0", "token_id:", "7", "token_id:٣", None,
                                           "tokenid:3", 3]))
    elif fault == "bad log-prob":
        logprobs[at] = draw(st.sampled_from([float("nan"), float("inf"), float("-inf"), None, "x", True, [0.0]])
                            | st.floats(1e-3, 1e6))
    elif fault == "log-probs count":
        logprobs = logprobs[:at] if draw(st.booleans()) else logprobs + [-1.0] * draw(st.integers(1, 3))
    elif fault == "too long":
        extra = draw(st.integers(MAX_NEW_TOKENS - length + 1, 20))  # past max_tokens, whatever the length drawn
        tokens, logprobs = tokens + ["token_id:1"] * extra, logprobs + [-1.0] * extra
    elif fault == "empty":
        tokens, logprobs = [], []
    return tokens, logprobs, fault


def answer_of(tokens: list, logprobs: list, choices: int) -> bytes:
    choice = {"index": 0, "text": "", "finish_reason": "length", "logprobs": {"tokens": tokens,
                                                                                "token_logprobs": logprobs}}
    return json.dumps({"choices": [choice] * choices}).encode()  # NaN and Infinity as Python's json writes them


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_completion_answer_is_read_against_what_was_asked(served, tmp_path, data):
    path, lm, tokenizer = served
    vocab = lm.get_input_embeddings().weight.shape[0]
    tokens, logprobs, fault = data.draw(completions(vocab))
    choices = data.draw(st.sampled_from([0, 2, 3])) if fault == "choices" else 1
    with servers.MisbehavingServer(servers.answer(200, answer_of(tokens, logprobs, choices))) as server:
        config = load_config(None, {"model.name_or_path": str(path), "rollout.backend": "vllm_server",
                                    "rollout.server.urls": [server.url], "rollout.server.model": "m",
                                    "rollout.server.timeout_s": 1.0, "rollout.server.request_timeout_s": 5.0,
                                    "rollout.max_new_tokens": MAX_NEW_TOKENS, "run.output_dir": str(tmp_path)})
        rollout = VLLMServerRollout(config, lm, tokenizer, torch.device("cpu"), str(tmp_path))
        try:
            if fault is None:
                batch = rollout.generate(["1+1=", "2+2="])
            else:
                with pytest.raises(ServerAnswerError) as raised:
                    rollout.generate(["1+1=", "2+2="])
        finally:
            rollout.close()
    if fault is None:
        ids = [int(t.split(":")[1]) for t in tokens]
        width = batch.completion_ids.shape[1]
        kept = batch.completion_attention[0].bool()
        assert batch.completion_ids[0][kept].tolist() == ids[:int(kept.sum())] and width == len(ids)
        assert torch.allclose(batch.sampler_logps[0][kept], torch.tensor(logprobs[:int(kept.sum())]))
    else:
        message = str(raised.value)
        assert server.url in message and "POST /v1/completions" in message and "\n" not in message, message
