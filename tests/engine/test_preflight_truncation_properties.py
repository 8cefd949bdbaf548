"""data.max_prompt_length cutting prompts (they keep their end, as TRL's) is said in one line per dataset when the run
starts, with how many it cuts; the count is the rollout's own: each prompt encoded as the rollout encodes it, with
the bound and without (hypothesis). Before, a bound below the prompts' length (1: every prompt one token) trained on
the prompts' last tokens alone without a word."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.config import load_config
from grpo_engine.model.loading import load_tokenizer
from grpo_engine.preflight import preflight
from grpo_engine.rollout.base import encode_prompts

PROMPTS = st.lists(st.text("0123456789+=", min_size=1, max_size=12), min_size=1, max_size=6)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(str(tiny_model_dir))


def cut_by_rollout(tokenizer, prompts: list[str], bound: int) -> int:
    """The prompts the rollout's encoding keeps fewer tokens of under `bound` than without a bound."""
    _, whole = encode_prompts(tokenizer, prompts, None, torch.device("cpu"))
    _, kept = encode_prompts(tokenizer, prompts, bound, torch.device("cpu"))
    return int((kept.sum(dim=1) < whole.sum(dim=1)).sum())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(train=PROMPTS, evaluation=st.one_of(st.just([]), PROMPTS), bound=st.one_of(st.none(), st.integers(1, 14)))
def test_prompts_cut_by_max_prompt_length_are_said_with_their_count(train, evaluation, bound, tiny_model_dir,
                                                                    tokenizer, tmp_path):
    config = load_config(overrides={"data.max_prompt_length": bound, "rollout.max_new_tokens": 8,
                                    "run.output_dir": str(tmp_path / "run")})
    notes = preflight(config, [{"prompt": p} for p in train], [{"prompt": p} for p in evaluation],
                      str(tiny_model_dir))
    for kind, prompts in (("training", train), ("evaluation", evaluation)):
        said = [note for note in notes if f"of the {kind} prompts of" in note]
        cut = cut_by_rollout(tokenizer, prompts, bound) if prompts and bound else 0
        assert len(said) == (cut > 0), (kind, prompts, bound, notes)
        if cut:
            share = "every one" if cut == len(prompts) else f"{cut} of the {len(prompts)}"
            assert said[0].startswith(f"data.max_prompt_length {bound} cuts {share} of the {kind} prompts") and \
                "\n" not in said[0], said[0]
