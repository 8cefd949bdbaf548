"""Property test of the loss's input space, the invalid side included: shapes, dtypes, masks and values (NaN and
infinities at padded and at scored positions). Every draw is accepted, with a finite loss and gradients that no
padded value changes, or refused before any work by one line from the boundary naming the argument."""

import dataclasses
import inspect
import os
import traceback
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import grpo_kernels
from grpo_kernels import FusedLinearGRPOLoss, GRPOLossConfig, LogitTransform, fused_linear_grpo_loss, linear_logprobs

DERANDOMIZE = bool(os.environ.get("CI"))
BOUNDARY = {"validation.py", "api.py", "config.py", "losses.py"}  # where a refusal may come from
POISONS = [float("nan"), float("inf"), float("-inf")]


@st.composite
def loss_calls(draw):
    B, T, H, V = draw(st.integers(0, 3)), draw(st.integers(0, 4)), draw(st.integers(1, 6)), draw(st.integers(2, 12))
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 10_000)))
    hidden = torch.randn(B, T, H, generator=gen).to(dtype)
    weight = torch.randn(V, H, generator=gen).to(draw(st.sampled_from([dtype, dtype, torch.float16])))
    mask = (torch.rand(B, T, generator=gen) > 0.3)
    mask_kind = draw(st.sampled_from(["bool", "int", "float", "twos"]))
    mask = {"bool": mask, "int": mask.long(), "float": mask.float(), "twos": mask.long() * 2}[mask_kind]
    ids = torch.randint(0, V + draw(st.sampled_from([0, 0, 0, 3])), (B, T), generator=gen)
    advantages = torch.randn(*draw(st.sampled_from([(B,), (B, T), (B + 1,)])), generator=gen)
    old = torch.randn(B, T, generator=gen) - 2
    ref = torch.randn(B, T, generator=gen) - 2
    poisoned = {}
    for name, tensor in (("old_logps", old), ("ref_logps", ref), ("advantages", advantages)):
        where = draw(st.sampled_from(["none", "padded", "scored"]))
        poison = draw(st.sampled_from(POISONS))
        if where == "none" or tensor.numel() == 0:
            continue
        target = (mask == 0) if where == "padded" else (mask != 0)
        if tensor.shape != mask.shape or not bool(target.any()):
            continue
        tensor[target] = poison
        poisoned[name] = where
    loss_type = draw(st.sampled_from(["dapo", "grpo", "cispo", "vespo"]))
    return dict(hidden=hidden, weight=weight, completion_ids=ids, completion_mask=mask, advantages=advantages,
                old_logps=old, ref_logps=ref), GRPOLossConfig(loss_type=loss_type, beta=0.04), poisoned


def expected_refusal(inputs, poisoned) -> str | None:
    """The argument a correct boundary must name, or None when the call is valid."""
    hidden, weight, mask, ids, advantages = (inputs[k] for k in ("hidden", "weight", "completion_mask",
                                                                  "completion_ids", "advantages"))
    B, T = hidden.shape[:2]
    if weight.dtype != hidden.dtype:
        return "weight"
    if ids.numel() and int(ids.max()) >= weight.shape[0]:
        return "completion_ids"
    if mask.numel() and bool((mask == 2).any()):
        return "completion_mask"
    if tuple(advantages.shape) not in ((B,), (B, T)):
        return "advantages"
    for name in ("advantages", "old_logps", "ref_logps"):
        if poisoned.get(name) == "scored":
            return name
    return None


def cleaned(inputs):
    """The same call with every non-finite value replaced (at padded positions the loss must not see them)."""
    return {k: torch.nan_to_num(v, nan=0.5, posinf=0.5, neginf=0.5) if v.is_floating_point() else v
            for k, v in inputs.items()}


def run(inputs, config):
    hidden = inputs["hidden"].clone().requires_grad_()
    weight = inputs["weight"].clone().requires_grad_()
    out = fused_linear_grpo_loss(**{**inputs, "hidden": hidden, "weight": weight}, config=config, backend="torch")
    out.loss.backward()
    return out.loss.detach(), hidden.grad, weight.grad


@pytest.mark.filterwarnings("ignore:.*importance_sampling_level:UserWarning")
@settings(max_examples=120, deadline=None, derandomize=DERANDOMIZE, suppress_health_check=[HealthCheck.too_slow])
@given(loss_calls())
def test_every_loss_input_is_accepted_correctly_or_refused_naming_the_argument(case):
    inputs, config, poisoned = case
    expected = expected_refusal(inputs, poisoned)
    try:
        loss, dhidden, dweight = run(inputs, config)
    except (TypeError, ValueError) as exc:
        assert expected is not None, f"refused a valid call: {exc}"
        message = str(exc)
        assert expected in message and "\n" not in message, (expected, message)
        origin = Path(traceback.extract_tb(exc.__traceback__)[-1].filename)
        assert origin.parent == Path(grpo_kernels.__file__).parent and origin.name in BOUNDARY, origin
        return
    assert expected is None, f"accepted a call that must be refused for {expected}"
    assert torch.isfinite(loss) and torch.isfinite(dhidden).all() and torch.isfinite(dweight).all()
    clean_loss, clean_dhidden, clean_dweight = run(cleaned(inputs), config)
    torch.testing.assert_close(loss, clean_loss, atol=0, rtol=0)  # a padded value changes nothing
    torch.testing.assert_close(dhidden, clean_dhidden, atol=0, rtol=0)
    torch.testing.assert_close(dweight, clean_dweight, atol=0, rtol=0)


class _BadRepr:
    def __repr__(self):
        raise RuntimeError("a repr that fails")


@st.composite
def hostile_values(draw):
    """A value of a kind no argument takes, or of the right kind and a wrong size: tensors and arrays of any shape
    and dtype (their repr spans lines), long and multi-line text, containers, huge and non-finite numbers."""
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool,
                                  torch.complex64]))
    return draw(st.sampled_from([
        torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype).numpy() if dtype not in (
            torch.bfloat16,) else [[0.0] * 9] * 9,
        "x" * draw(st.integers(0, 300)), "line\nbreak", [1, 2], {"k": [1] * 50}, (None,), _BadRepr(), object(),
        float("nan"), float("-inf"), 10 ** 40, -(2 ** 70), True, b"\x00" * 80]))


# the optional arguments of the public entry points, with the value each call takes as it is
LOSS_ARGUMENTS = [name for name in inspect.signature(fused_linear_grpo_loss).parameters
                  if name not in ("hidden", "weight", "completion_ids", "completion_mask", "advantages")]
LOGPROB_ARGUMENTS = [name for name in inspect.signature(linear_logprobs).parameters
                     if name not in ("hidden", "weight", "targets")]


def _refused_on_one_line(call, argument):
    try:
        call()
    except (TypeError, ValueError) as exc:
        message = str(exc)
        assert "\n" not in message and argument.split(".")[-1] in message and len(message) < 600, (argument, message)


@settings(max_examples=150, deadline=None, derandomize=DERANDOMIZE, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["loss", "logprobs", "config", "transform", "module"]), st.data())
def test_a_hostile_value_of_any_argument_is_refused_on_one_line_naming_it(entry, data):
    """Every optional argument of the loss and the log-probs, every setting of GRPOLossConfig and LogitTransform,
    every argument of the Liger-compatible module's constructor (by Liger's names):
    a value of a kind they do not take is accepted (where it happens to be valid) or refused by one line that names
    the argument, never a crash elsewhere or a message that prints a tensor's elements."""
    value = data.draw(hostile_values())
    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(2, 3, 8, generator=gen), torch.randn(16, 8, generator=gen)
    ids, mask = torch.randint(0, 16, (2, 3), generator=gen), torch.ones(2, 3, dtype=torch.int64)
    if entry == "loss":
        name = data.draw(st.sampled_from(LOSS_ARGUMENTS))
        _refused_on_one_line(lambda: fused_linear_grpo_loss(hidden, weight, ids, mask, torch.randn(2),
                                                            **{name: value}), name)
    elif entry == "logprobs":
        name = data.draw(st.sampled_from(LOGPROB_ARGUMENTS))
        _refused_on_one_line(lambda: linear_logprobs(hidden, weight, ids, **{name: value}), name)
    elif entry == "config":
        name = data.draw(st.sampled_from([f.name for f in dataclasses.fields(GRPOLossConfig)]))
        _refused_on_one_line(lambda: GRPOLossConfig(**{name: value}), name)
    elif entry == "transform":
        name = data.draw(st.sampled_from(["scale", "softcap"]))
        _refused_on_one_line(lambda: LogitTransform(**{name: value}), f"LogitTransform.{name}")
    else:
        name = data.draw(st.sampled_from(list(inspect.signature(FusedLinearGRPOLoss).parameters)))
        _refused_on_one_line(lambda: FusedLinearGRPOLoss(**{name: value}), name)
