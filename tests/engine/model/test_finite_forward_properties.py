"""A model whose forward gives NaN or inf while its weights are finite (an activation overflowing its dtype, a
forward hook, a patched module): hypothesis draws the module that goes wrong, the value it gives and the phase
that meets it (sampling, greedy decoding, scoring padded or packed), and each stops in one line saying what the
forward gave and where to look (grpo_engine/model/finite_forward.py). Before, sampling failed inside torch
("probability tensor contains either inf, nan or element < 0"), greedy decoding read NaN as the largest logit and
went on, and scoring stopped in the loss library's "hidden contains NaN or Inf values"."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from grpo_engine import trainer as trainer_module
from grpo_engine.config import ModelConfig, RolloutConfig, load_config
from grpo_engine.model.finite_forward import NonFiniteForwardError
from grpo_engine.model.loading import HiddenStatePolicy, load_causal_lm, load_tokenizer
from grpo_engine.rollout.hf import generate_completions
from grpo_engine.state.checkpoint import list_checkpoints
from grpo_engine.steps.logprobs import sequence_logprobs
from grpo_engine.steps.packing import Packing
from rollout_batches import synthetic_batch

CPU = torch.device("cpu")
PHASES = ("sample", "greedy", "score padded", "score packed")


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_causal_lm(str(tiny_model_dir), ModelConfig(), CPU), load_tokenizer(str(tiny_model_dir))


def modules_of(lm: nn.Module, phase: str) -> list[str]:
    """The modules whose output is one tensor: linear layers and norms (scoring reads the hidden states, so the
    head's own forward is not on its path)."""
    names = [name for name, module in lm.named_modules()
             if isinstance(module, nn.Linear) or type(module).__name__.endswith("RMSNorm")]
    return [name for name in names if not (phase.startswith("score") and name == "lm_head")]


def run_phase(lm, tokenizer, phase: str) -> None:
    if phase in ("sample", "greedy"):
        generate_completions(lm, tokenizer, ["1+1=", "12+30="], RolloutConfig(max_new_tokens=4), None, CPU,
                             greedy=phase == "greedy")
    else:
        packing = Packing(max_tokens=64) if phase == "score packed" else None
        sequence_logprobs(HiddenStatePolicy(lm), synthetic_batch(lm.config.vocab_size), 1.0, 4, "torch",
                          packing=packing)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(phase=st.sampled_from(PHASES), value=st.sampled_from([math.nan, math.inf, -math.inf]), data=st.data())
def test_a_forward_that_gives_nan_or_inf_stops_in_one_line_naming_what_it_gave(tiny, phase, value, data):
    lm, tokenizer = tiny
    name = data.draw(st.sampled_from(modules_of(lm, phase)), label="module")
    handle = lm.get_submodule(name).register_forward_hook(lambda module, args, output: torch.full_like(output, value))
    try:
        with pytest.raises(NonFiniteForwardError) as raised:
            run_phase(lm, tokenizer, phase)
    finally:
        handle.remove()
    message = str(raised.value)
    assert "\n" not in message and "model.dtype float32" in message and "forward hook" in message, message
    what = "logits while sampling" if phase in ("sample", "greedy") else "hidden states while scoring"
    assert f"the model's forward gave NaN or inf {what}" in message, message
    run_phase(lm, tokenizer, phase)  # the model itself was never changed: without the hook it runs


@pytest.mark.slow  # train() end to end: the slow tier
def test_a_forward_that_turns_nan_mid_run_stops_the_run_naming_the_step(small_overrides, monkeypatch):
    """Step 2's forwards give NaN (a hook armed after step 1's update): the run stops there in one line naming
    step 2, having saved nothing of it (the checkpoint of step 1 stays)."""
    real_setup, real_update = trainer_module.setup_run, trainer_module.update
    armed = {}

    def setup(config):
        run = real_setup(config)
        layer = run.lm.model.layers[0].mlp.down_proj
        layer.register_forward_hook(lambda module, args, output: output * math.nan if armed else output)
        return run

    def update(*args, **kwargs):
        metrics = real_update(*args, **kwargs)
        armed["on"] = True
        return metrics

    monkeypatch.setattr(trainer_module, "setup_run", setup)
    monkeypatch.setattr(trainer_module, "update", update)
    config = load_config(overrides={**small_overrides, "run.max_steps": 3, "run.save_steps": 1})
    with pytest.raises(NonFiniteForwardError, match="NaN or inf logits while sampling at step 2, although its "
                                                    "weights are finite"):
        trainer_module.train(config)
    assert [path.name for path in list_checkpoints(config.run.output_dir)] == ["checkpoint-000001"]


class _HostReads(torch.overrides.TorchFunctionMode):
    """Records the calls that bring a tensor's value to the host (a sync on a GPU)."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("__bool__", "item", "tolist", "__float__", "__int__"):
            self.reads.append(func.__name__)
        return func(*args, **(kwargs or {}))


@settings(max_examples=20, deadline=None)
@given(rows=st.lists(st.sampled_from(["fine", "nan", "+inf", "all -inf", "some -inf"]), min_size=1, max_size=4),
       steps=st.integers(1, 4))
def test_the_sampling_check_reads_nothing_back_per_token_and_says_a_broken_row_after(rows, steps):
    from grpo_engine.model.finite_forward import FiniteLogits

    check = FiniteLogits()
    scores = torch.randn(len(rows), 7)
    for i, kind in enumerate(rows):
        if kind == "nan":
            scores[i, 3] = math.nan
        elif kind == "+inf":
            scores[i, 1] = math.inf
        elif kind == "all -inf":
            scores[i] = -math.inf
        elif kind == "some -inf":
            scores[i, :3] = -math.inf
    with _HostReads() as host:
        for _ in range(steps):
            out = check(torch.zeros(len(rows), 1, dtype=torch.long), scores.clone())
    assert host.reads == []
    broken = [kind in ("nan", "+inf", "all -inf") for kind in rows]
    for i, is_broken in enumerate(broken):  # what the sampler draws from: a broken row all zeros, others untouched
        assert torch.equal(out[i], torch.zeros(7)) if is_broken else torch.equal(out[i], scores[i])
    if any(broken):
        with pytest.raises(NonFiniteForwardError, match="logits while sampling"):
            check.raise_if_seen()
    else:
        check.raise_if_seen()
