"""Property test of the logits' range: hidden states and a head each finite, but large enough together that their
logits could pass float32's range (H max|hidden| max|weight| + max|bias|, times the head's factors, past a quarter of
float32's largest value), are refused before any work in one line naming both; below that, every backend answers
finite log-probs and losses, those of the float64 reference; logits passed whole are held to the same bound. Before,
hidden and weight near 1e20 gave NaN log-probs and losses on every backend without an error (the float64 reference:
finite ones), and so did logits of 3e38 passed whole."""

from __future__ import annotations

import math
import os
import traceback
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import grpo_kernels
from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, linear_logprobs

DERANDOMIZE = bool(os.environ.get("CI"))
FLOAT32_QUARTER = torch.finfo(torch.float32).max / 4


@st.composite
def head_calls(draw):
    """Hidden states and a head scaled to 10**k (k up to 30 each: their logits from moderate to past float32's range),
    a bias or none, a temperature, the entry point and backend."""
    hidden_exp, weight_exp = draw(st.integers(0, 30)), draw(st.integers(0, 30))
    bias_exp = draw(st.one_of(st.none(), st.integers(0, 38)))
    H = draw(st.sampled_from([1, 4, 16]))
    temperature = draw(st.sampled_from([1.0, 0.7, 1e-3]))
    entry = draw(st.sampled_from(["logprobs", "loss"]))
    backend = draw(st.sampled_from(["torch", "gemm", "reference"]))
    return hidden_exp, weight_exp, bias_exp, H, temperature, entry, backend, draw(st.integers(0, 1000))


def _inputs(hidden_exp, weight_exp, bias_exp, H, seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    hidden = (torch.rand(2, 3, H, generator=gen, dtype=torch.float64) * 2 - 1) * 10.0 ** hidden_exp
    weight = (torch.rand(5, H, generator=gen, dtype=torch.float64) * 2 - 1) * 10.0 ** weight_exp
    bias = None if bias_exp is None else (torch.rand(5, generator=gen, dtype=torch.float64) * 2 - 1) * 10.0 ** bias_exp
    ids = torch.randint(0, 5, (2, 3), generator=gen)
    cast = (lambda x: None if x is None else x.to(dtype))
    return cast(hidden), cast(weight), cast(bias), ids


def _call(entry, backend, hidden, weight, bias, ids, temperature):
    if entry == "logprobs":
        return linear_logprobs(hidden, weight, ids, bias=bias, temperature=temperature, backend=backend)
    # no KL term: exp of a log-ratio of 1e38 is infinite in float64 too, the loss's own math
    out = fused_linear_grpo_loss(hidden, weight, ids, torch.ones(2, 3), torch.tensor([1.0, -1.0], dtype=hidden.dtype),
                                 bias=bias, config=GRPOLossConfig(temperature=temperature, beta=0.0), backend=backend)
    return torch.cat([out.logps.reshape(-1), out.loss.reshape(1)])


@settings(max_examples=120, deadline=None, derandomize=DERANDOMIZE, suppress_health_check=[HealthCheck.too_slow])
@given(head_calls())
def test_logits_past_float32_are_refused_naming_the_inputs_else_finite(call):
    hidden_exp, weight_exp, bias_exp, H, temperature, entry, backend, seed = call
    hidden, weight, bias, ids = _inputs(hidden_exp, weight_exp, bias_exp, H, seed, torch.float32)
    bound = (H * float(hidden.abs().max()) * float(weight.abs().max())
             + (0.0 if bias is None else float(bias.abs().max()))) / temperature
    try:
        got = _call(entry, backend, hidden, weight, bias, ids, temperature)
    except ValueError as exc:
        message = str(exc)
        assert "\n" not in message and "hidden" in message and "weight" in message and "too large" in message, message
        origin = Path(traceback.extract_tb(exc.__traceback__)[-1].filename)
        assert origin.parent == Path(grpo_kernels.__file__).parent and origin.name == "validation.py", origin
        assert bound > FLOAT32_QUARTER / 4, f"refused with logits bounded by {bound:.3g}"  # (float32 rounding aside)
        return
    assert bound <= FLOAT32_QUARTER * 1.01, f"accepted with logits bounded by {bound:.3g}"
    assert bool(torch.isfinite(got).all()), f"accepted inputs (bound {bound:.3g}) gave {got.tolist()}"
    want = _call(entry, "reference", *(x if x is None else x.double() for x in (hidden, weight, bias)), ids,
                 temperature)
    scale = 1 + float(want.abs().max())
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5 * scale)


def test_the_largest_inputs_below_the_bound_are_answered_and_just_past_it_refused():
    H = 4
    side = math.sqrt(FLOAT32_QUARTER / H) * 0.99
    hidden, weight = torch.full((1, 2, H), side), torch.full((3, H), side)
    ids = torch.zeros(1, 2, dtype=torch.long)
    assert bool(torch.isfinite(linear_logprobs(hidden, weight, ids, backend="torch")).all())
    try:
        linear_logprobs(hidden * 1.1, weight, ids, backend="torch")
    except ValueError as exc:
        assert "too large" in str(exc)
    else:
        raise AssertionError("hidden x weight past the bound was taken")


@st.composite
def logits_calls(draw):
    """Logits scaled to 10**k (k from 30 to 38: from moderate to float32's largest) in float32 or float64, one
    large value or a spread of both signs, a temperature, a backend."""
    exponent = draw(st.integers(30, 38))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    spread = draw(st.booleans())
    temperature = draw(st.sampled_from([1.0, 0.7, 1e-3]))
    return exponent, dtype, spread, temperature, draw(st.sampled_from(["torch", "gemm", "reference"])), \
        draw(st.integers(0, 1000))


@settings(max_examples=60, deadline=None, derandomize=DERANDOMIZE, suppress_health_check=[HealthCheck.too_slow])
@given(logits_calls())
def test_logits_given_whole_past_float32_are_refused_else_finite(call):
    """The same bound for logits passed whole (grpo_loss_from_logits): finite logits of 3e38, or of 1e36 at
    temperature 0.01, gave NaN log-probs and losses without an error (the log-probs come out float32)."""
    exponent, dtype, spread, temperature, backend, seed = call
    gen = torch.Generator().manual_seed(seed)
    logits = torch.rand(2, 3, 5, generator=gen, dtype=torch.float64) * 3.4 * 10.0 ** exponent
    if spread:
        logits = logits * torch.tensor([1.0, -1.0, 1.0, -1.0, 0.5], dtype=torch.float64)
    logits = logits.clamp(-torch.finfo(torch.float32).max, torch.finfo(torch.float32).max).to(dtype)
    bound = float(logits.abs().max()) / temperature
    try:
        out = grpo_kernels.grpo_loss_from_logits(logits, torch.randint(0, 5, (2, 3), generator=gen), torch.ones(2, 3),
                                                 torch.tensor([1.0, -1.0], dtype=dtype),
                                                 config=GRPOLossConfig(temperature=temperature, beta=0.0),
                                                 backend=backend)
    except ValueError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith("logits are too large"), message
        assert bound > FLOAT32_QUARTER * 0.99, f"refused with logits bounded by {bound:.3g}"
        return
    assert bound <= FLOAT32_QUARTER * 1.01, f"accepted logits bounded by {bound:.3g}"
    got = torch.cat([out.logps.reshape(-1), out.loss.reshape(1)])
    assert bool(torch.isfinite(got).all()), f"accepted logits (bound {bound:.3g}) gave {got.tolist()}"
