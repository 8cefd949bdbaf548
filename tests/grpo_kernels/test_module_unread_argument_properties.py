"""Property test of the Liger-compatible module's reference arguments where its semantics leave them unread
(use_ref_model=False, beta=0, or ref_per_token_logps given beside ref_input): a value of a kind the argument never
takes (text, a number, a list, an array, a sparse or nested tensor) is refused by one line naming it before any work,
whatever the module's settings; a tensor there is taken as before, and changes nothing it does not read. Before, an
unread argument took any value silently, and the same call failed once a config turned the KL term on."""

from __future__ import annotations

import os
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import grpo_kernels
from grpo_kernels import FusedLinearGRPOLoss

DERANDOMIZE = bool(os.environ.get("CI"))
B, T, H, V = 2, 3, 4, 6
REFERENCE_ARGUMENTS = ["ref_per_token_logps", "ref_input", "ref_weight", "ref_bias"]
BOUNDARY = {"validation.py", "module.py", "api.py"}


def _inputs(seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return dict(_input=torch.randn(B, T, H, generator=gen), lin_weight=torch.randn(V, H, generator=gen),
                selected_token_ids=torch.randint(0, V, (B, T), generator=gen), attention_mask=torch.ones(B, T),
                advantages=torch.randn(B, generator=gen))


def _valid(name: str, gen: torch.Generator) -> torch.Tensor:
    return {"ref_per_token_logps": -torch.rand(B, T, generator=gen), "ref_input": torch.randn(B, T, H, generator=gen),
            "ref_weight": torch.randn(V, H, generator=gen), "ref_bias": torch.randn(V, generator=gen)}[name]


def _not_a_tensor(draw, valid: torch.Tensor):
    """A value of a kind no tensor argument takes, made from the valid tensor where it can be."""
    return draw(st.sampled_from([
        "ref", "", 0.5, 0, True, valid.tolist(), valid.numpy(), np.float32(1.0), (valid,), {"x": valid},
        valid.to_sparse(), torch.nested.nested_tensor([valid.reshape(-1)]), object()]))


@st.composite
def unread_calls(draw):
    """(module settings, the arguments, the argument given a bad value or None)."""
    use_ref_model, beta = draw(st.booleans()), draw(st.sampled_from([0.0, 0.04]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 1000)))
    extra = {name: _valid(name, gen) for name in draw(st.sets(st.sampled_from(REFERENCE_ARGUMENTS)))}
    if use_ref_model and beta != 0.0:
        extra.setdefault("ref_per_token_logps", _valid("ref_per_token_logps", gen))  # the one read; others unread
    bad = draw(st.one_of(st.none(), st.sampled_from(REFERENCE_ARGUMENTS)))
    if bad is not None:
        extra[bad] = _not_a_tensor(draw, _valid(bad, gen))
    return dict(use_ref_model=use_ref_model, beta=beta), extra, bad


@pytest.mark.filterwarnings("ignore:Both ref_per_token_logps and ref_input:UserWarning")  # Liger's own warning
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage:UserWarning")
@settings(max_examples=150, deadline=None, derandomize=DERANDOMIZE, suppress_health_check=[HealthCheck.too_slow])
@given(unread_calls(), st.integers(0, 1000))
def test_an_unread_reference_argument_of_the_wrong_kind_is_refused_naming_it(case, seed):
    options, extra, bad = case
    module = FusedLinearGRPOLoss(**options, backend="torch")
    inputs = _inputs(seed)
    try:
        loss, _ = module(**inputs, **extra)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        assert bad is not None, f"refused a valid call ({options}, {sorted(extra)}): {message}"
        assert bad in message and "\n" not in message and len(message) < 400, (bad, message)
        origin = Path(traceback.extract_tb(exc.__traceback__)[-1].filename)
        assert origin.parent == Path(grpo_kernels.__file__).parent and origin.name in BOUNDARY, origin
        return
    assert bad is None, f"took {bad}={type(extra[bad]).__name__} with {options}"
    # what the module does not read changes nothing: the same loss without the unread arguments
    read = {"ref_per_token_logps": extra["ref_per_token_logps"]} if options["use_ref_model"] and options["beta"] \
        else {}
    alone, _ = module(**inputs, **read)
    torch.testing.assert_close(loss, alone, rtol=0, atol=0)
