"""TorchScript around every entry point (torch.jit.script of it, torch.jit.trace through it): one line naming the
entry and the ways that do capture the loss, before any work.

Before: torch.jit.script failed inside TorchScript's frontend ("Compiled functions can't take variable number of
arguments ...", "Expected a single top-level function: .../module.py:312"), and torch.jit.trace failed deep inside the
input checks with "AssertionError: Expected bool, got <class 'torch.Tensor'>". torch.fx.symbolic_trace (of the module,
or of a function calling an entry point) failed in the input checks naming an input the caller passed as a tensor
("ref_per_token_logps must be a torch.Tensor, got Proxy"); it is refused the same way."""

from __future__ import annotations

import warnings

import pytest
import torch

from grpo_kernels import FusedLinearGRPOLoss, fused_linear_grpo_loss, grpo_loss_from_logits, linear_logprobs
from grpo_testing import make_problem

P = make_problem(0, B=2, T=3, H=8, V=16)
ENTRIES = {  # name -> (what torch.jit.script is given, a call of it on (hidden, weight))
    "fused_linear_grpo_loss": (fused_linear_grpo_loss, lambda h, w: fused_linear_grpo_loss(
        h, w, P.completion_ids, P.completion_mask, P.advantages).loss),
    "linear_logprobs": (linear_logprobs, lambda h, w: linear_logprobs(h, w, P.completion_ids)),
    "grpo_loss_from_logits": (grpo_loss_from_logits, lambda h, w: grpo_loss_from_logits(
        h @ w.T, P.completion_ids, P.completion_mask, P.advantages).loss),
    "FusedLinearGRPOLoss": (FusedLinearGRPOLoss(), lambda h, w: FusedLinearGRPOLoss(beta=0.0)(
        h, w, P.completion_ids, P.completion_mask, P.advantages)[0]),
}
TRACED_AS = {"FusedLinearGRPOLoss": "fused_linear_grpo_loss"}  # the module's forward runs the loss


def _one_line(exc: pytest.ExceptionInfo, name: str) -> None:
    message = str(exc.value)
    assert "\n" not in message and message.startswith(name) and "torch.compile" in message


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_scripting_an_entry_point_is_refused_naming_it(entry):
    with warnings.catch_warnings(), pytest.raises(TypeError) as exc:
        warnings.simplefilter("ignore")  # torch 2.13 deprecates TorchScript
        torch.jit.script(ENTRIES[entry][0])
    _one_line(exc, entry)


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_tracing_through_an_entry_point_is_refused_naming_it(entry):
    with warnings.catch_warnings(), pytest.raises(RuntimeError) as exc:
        warnings.simplefilter("ignore")  # TracerWarnings; torch 2.13 deprecates TorchScript
        torch.jit.trace(ENTRIES[entry][1], (P.hidden, P.weight))
    _one_line(exc, TRACED_AS.get(entry, entry))


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_the_same_call_outside_torchscript_still_runs(entry):
    assert torch.isfinite(ENTRIES[entry][1](P.hidden, P.weight)).all()


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_symbolic_tracing_an_entry_point_is_refused_naming_it(entry):
    """The module is traced itself (FX traces a module's calls of modules it does not own as errors of its own), a
    function through a function calling it (symbolic_trace takes tensors only, not the functions' options)."""
    entry_point, call = ENTRIES[entry]
    with pytest.raises(RuntimeError) as exc:
        torch.fx.symbolic_trace(entry_point if isinstance(entry_point, torch.nn.Module) else call)
    _one_line(exc, entry)
    assert "symbolic_trace" in str(exc.value)
