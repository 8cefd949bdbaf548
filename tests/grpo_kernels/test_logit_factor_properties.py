"""Property test of the logits' factors: a LogitTransform's scale and soft-cap and the temperature, each a finite
number, combine into the constants every backend multiplies float32 logits by (LMHead.logit_constants). Over
magnitudes from 1e-320 to 1e308 drawn for each, a call is either refused before any work by one line naming
logit_transform and the temperature, or answers finite log-probs (and gradients), those of the float64 reference
where the factors are moderate. Before, a scale of 1e200 (or of 1e30 over a temperature of 1e-30) was accepted and
every backend's log-probs were NaN."""

from __future__ import annotations

import os
import traceback
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import grpo_kernels
from grpo_kernels import GRPOLossConfig, LogitTransform, fused_linear_grpo_loss, linear_logprobs

DERANDOMIZE = bool(os.environ.get("CI"))
BOUNDARY = {"validation.py", "api.py", "config.py"}


def magnitudes(low: int, high: int, signed: bool = False):
    """10**k (k drawn in [low, high]) times a mantissa, the sign drawn when `signed`: the whole range of a float."""
    value = st.builds(lambda k, m: m * 10.0 ** k, st.integers(low, high), st.floats(1.0, 9.99))
    return st.builds(lambda v, negative: -v if negative else v, value, st.booleans()) if signed else value


@st.composite
def factor_calls(draw):
    # the whole range, and the moderate one where models' values lie (accepted, and compared with the reference)
    scale = draw(st.one_of(magnitudes(-320, 307, signed=True), magnitudes(-3, 3, signed=True), st.just(0.0)))
    softcap = draw(st.one_of(st.none(), magnitudes(-320, 307), magnitudes(-3, 3)))
    temperature = draw(st.one_of(magnitudes(-30, 300), magnitudes(-3, 3)))
    return scale, softcap, temperature


def _head_inputs(seed: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, 3, 4, generator=gen, dtype=torch.float64).to(dtype)
    weight = torch.randn(7, 4, generator=gen, dtype=torch.float64).to(dtype)
    ids = torch.randint(0, 7, (2, 3), generator=gen)
    return hidden, weight, ids


def _run(entry: str, backend: str, transform: LogitTransform, temperature: float, seed: int, dtype=torch.float32):
    hidden, weight, ids = _head_inputs(seed, dtype)
    hidden.requires_grad_()
    if entry == "logprobs":
        logps = linear_logprobs(hidden, weight, ids, temperature=temperature, logit_transform=transform,
                                backend=backend)
        total = logps.sum()
    else:
        out = fused_linear_grpo_loss(hidden, weight, ids, torch.ones(2, 3), torch.tensor([1.0, -1.0], dtype=dtype),
                                     config=GRPOLossConfig(temperature=temperature), logit_transform=transform,
                                     backend=backend)
        logps, total = out.logps, out.loss
    (grad,) = torch.autograd.grad(total, hidden)
    return logps.detach(), grad


@settings(max_examples=150, deadline=None, derandomize=DERANDOMIZE, suppress_health_check=[HealthCheck.too_slow])
@given(factor_calls(), st.sampled_from(["torch", "gemm", "reference"]), st.sampled_from(["logprobs", "loss"]),
       st.integers(0, 1000))
def test_logit_factors_give_finite_log_probs_or_are_refused_naming_them(factors, backend, entry, seed):
    scale, softcap, temperature = factors
    transform = LogitTransform(scale=scale, softcap=softcap)  # each setting alone is a finite number: taken
    try:
        logps, grad = _run(entry, backend, transform, temperature, seed)
    except ValueError as exc:
        message = str(exc)
        # the factors together (logit_transform and the temperature), or the temperature alone past its own bounds
        together = "logit_transform" in message or message.startswith("temperature must be")
        assert "\n" not in message and together and "temperature" in message, message
        origin = Path(traceback.extract_tb(exc.__traceback__)[-1].filename)
        assert origin.parent == Path(grpo_kernels.__file__).parent and origin.name in BOUNDARY, origin
        return
    assert bool(torch.isfinite(logps).all()), f"accepted factors {factors} gave log-probs {logps.tolist()}"
    assert bool(torch.isfinite(grad).all()), f"accepted factors {factors} gave a non-finite gradient"
    assert bool((logps <= 1e-4 * (1 + logps.abs().max())).all()), logps  # log-probabilities
    factor = max(abs(scale), abs(softcap or 0.0), abs(scale / softcap) if softcap else 0.0) / temperature
    if factor <= 1e3 and abs(scale) >= 1e-30:  # moderate factors: the float64 reference's values
        want, _ = _run(entry, "reference", transform, temperature, seed, torch.float64)
        torch.testing.assert_close(logps.double(), want.double(), rtol=1e-3, atol=1e-3 * (1 + float(want.abs().max())))

