"""The model a vLLM server serves, checked when the run connects (before any weights load): rollout.server.model
must be a name the server lists, and the server's max_model_len must hold data.max_prompt_length +
rollout.max_new_tokens. Before: another name was an HTTP 404 at the first batch, after the first weight push, and
a short --max-model-len an HTTP 400 at the first prompt long enough, which could be hours into a run."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from grpo_engine.config import ConfigError, load_config
from grpo_engine.rollout.server import check_servers_up
from tests.support import misbehaving_server as servers

NAMES = st.sampled_from(["Qwen/Qwen2.5-0.5B", "/models/policy", "m", "policy-lora-3"])


@settings(max_examples=40, deadline=None)
@given(served=st.lists(NAMES, min_size=1, max_size=3, unique=True), asked=st.none() | NAMES,
       max_model_len=st.none() | st.integers(1, 200), prompt=st.none() | st.integers(1, 100),
       new_tokens=st.integers(1, 100))
def test_the_served_model_is_checked_at_connect(served, asked, max_model_len, prompt, new_tokens):
    models = {"object": "list", "data": [{"id": name, "object": "model", **(
        {} if max_model_len is None else {"max_model_len": max_model_len})} for name in served]}
    with servers.MisbehavingServer(servers.answer(200, json.dumps(models).encode())) as server:
        config = load_config(None, {"rollout.backend": "vllm_server", "rollout.server.urls": [server.url],
                                    "rollout.server.model": asked, "data.max_prompt_length": prompt,
                                    "rollout.max_new_tokens": new_tokens, "rewards.length_cache": 0})
        unknown = asked is not None and asked not in served
        too_short = max_model_len is not None and max_model_len < (prompt or 1) + new_tokens
        if not unknown and not too_short:
            check_servers_up(config)
            return
        with pytest.raises(ConfigError) as raised:
            check_servers_up(config)
    message = str(raised.value)
    assert server.url in message and "\n" not in message, message
    key = "rollout.server.model" if unknown else "rollout.server.urls"
    assert message.startswith(key), message
    if not unknown:
        assert f"--max-model-len {(prompt or 1) + new_tokens}" in message, message
