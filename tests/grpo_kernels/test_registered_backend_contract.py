"""A registered (user) backend that breaks the Protocol (grpo_kernels/backends/protocol.py) is named by one line, from
any entry point, rather than failing far from it or training wrongly: each way a plugin's linear_forward or
linear_backward can return the wrong thing, and an error it raises, drawn afresh.

Before: a [N, 1] or short result failed in a reshape or a broadcast inside torch, a 2-tuple in an unpacking, a view
of an input in the custom op's aliasing check, another device in a copy; NaN statistics gave a NaN loss and a
negative log-likelihood in place of the log-prob a wrong one, silently; a gradient returned as None left `.grad`
None (nothing trained) without a word; an entropy outside [0, log V] (negated, or summed) gave a wrong entropy
metric and entropy-bonus gradient, silently.
"""

from __future__ import annotations

import os
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_kernels import FusedLinearGRPOLoss, GRPOLossConfig, fused_linear_grpo_loss, linear_logprobs, routing
from grpo_kernels.backends import BACKENDS, BackendSpec, register_backend, torch_streaming
from grpo_testing import make_problem

DERANDOMIZE = bool(os.environ.get("CI"))
NAME = "faulty"


def _forward_faults():
    def replace(index, value):
        return lambda out, hidden: tuple(value(x, hidden) if i == index else x for i, x in enumerate(out))

    return {  # fault -> (what the backend does to its correct result, the refusal's words)
        "column": (replace(0, lambda x, h: x[:, None]), r"returned logps as float32 \[\d+, 1\]"),
        "short": (replace(1, lambda x, h: x[:-1]), r"returned entropy as float32 \[\d+\]"),
        "float64": (replace(2, lambda x, h: x.double()), r"returned lse as float64"),
        "float16": (replace(0, lambda x, h: x.half()), r"returned logps as float16"),
        "pair": (lambda out, h: out[:2], r"returned tuple of 2, expected the 3-tuple \(logps, entropy, lse\)"),
        "none": (lambda out, h: None, r"returned NoneType, expected the 3-tuple"),
        "meta": (replace(1, lambda x, h: x.to("meta")), r"returned entropy as float32 \[\d+\] on meta"),
        "view_of_hidden": (replace(0, lambda x, h: h[:, 0]), r"returned logps in the memory of one of its inputs"),
        "nan": (replace(0, lambda x, h: x * float("nan")), r"returned NaN or infinite logps from finite inputs"),
        "negative_log_likelihood": (replace(0, lambda x, h: -x), r"returned log-probs above 0"),
        # an entropy is of a softmax over the V = 40 head rows, in [0, log 40]: negated, or summed over rows
        "negated_entropy": (replace(1, lambda x, h: -x - 0.01), r"returned entropies outside \[0, log V\]"),
        "entropy_past_log_v": (replace(1, lambda x, h: x + 3.7), r"returned entropies outside \[0, log V\] = "
                                                                  r"\[0, 3.689\]"),
    }


def _backward_faults():
    return {
        "transposed": (lambda grads: (grads[0].T.contiguous(), *grads[1:]),
                       r"returned dhidden as float32 \[16, \d+\]"),
        "nan": (lambda grads: (grads[0] * float("nan"), *grads[1:]), r"returned NaN or infinite gradients"),
        "missing": (lambda grads: (None, *grads[1:]), r"returned None for dhidden, which the call needs"),
        "missing_weight": (lambda grads: (grads[0], None, grads[2]), r"returned None for dweight, which the call needs"),
    }


FORWARD, BACKWARD = _forward_faults(), _backward_faults()


class FaultyBackend:
    """The torch backend's passes, one of them returning the wrong thing (or raising)."""

    fault: tuple[str, str] = ("forward", "")

    def __init__(self, workspace_bytes: int):
        pass

    def linear_forward(self, hidden, head, targets):
        where, fault = self.fault
        if where == "forward" and fault == "raises":
            raise KeyError("the plugin's own bug")
        out = torch_streaming.linear_forward(hidden, head, targets)
        return FORWARD[fault][0](out, hidden) if where == "forward" else out

    def linear_backward(self, *args, **kwargs):
        where, fault = self.fault
        if where == "backward" and fault == "raises":
            raise KeyError("the plugin's own bug")
        grads = torch_streaming.linear_backward(*args, **kwargs)
        return BACKWARD[fault][0](grads) if where == "backward" else grads


def backend(workspace_bytes: int) -> FaultyBackend:
    return FaultyBackend(workspace_bytes)


@pytest.fixture(scope="module", autouse=True)
def faulty():
    register_backend(BackendSpec(NAME, __name__, "returns what it is told to get wrong"))
    yield
    BACKENDS.pop(NAME, None)
    routing._cached_route.cache_clear()


def _run(entry: str, seed: int) -> None:
    p = make_problem(seed, B=2, T=4, H=16, V=40)
    hidden, weight = p.hidden.clone().requires_grad_(), p.weight.clone().requires_grad_()
    bias = p.bias.clone().requires_grad_()
    if entry == "logprobs":
        loss = linear_logprobs(hidden, weight, p.completion_ids, bias=bias, backend=NAME).sum()
    elif entry == "module":
        loss = FusedLinearGRPOLoss(loss_type="grpo", backend=NAME)(
            hidden, weight, p.completion_ids, p.completion_mask, p.advantages, bias=bias,
            ref_per_token_logps=p.ref_logps, old_per_token_logps=p.old_logps)[0]
    else:
        loss = fused_linear_grpo_loss(hidden, weight, p.completion_ids, p.completion_mask, p.advantages, bias=bias,
                                      old_logps=p.old_logps, ref_logps=p.ref_logps,
                                      config=GRPOLossConfig(loss_type="grpo", beta=0.04), backend=NAME).loss
    loss.backward()
    assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in (hidden, weight, bias))


faults = st.one_of(st.sampled_from([("forward", name) for name in [*FORWARD, "raises"]]),
                   st.sampled_from([("backward", name) for name in [*BACKWARD, "raises"]]))


@settings(max_examples=60, deadline=None, derandomize=DERANDOMIZE)
@given(fault=faults, entry=st.sampled_from(["loss", "module", "logprobs"]), seed=st.integers(0, 2**16))
def test_a_backend_breaking_the_protocol_is_named_on_one_line(fault, entry, seed):
    FaultyBackend.fault = fault
    where, name = fault
    method = f"linear_{where}"
    if name == "raises":  # the plugin's own error, as it raised it, with a note saying where
        with pytest.raises(KeyError, match="the plugin's own bug") as raised:
            _run(entry, seed)
        assert f"in {method} of backend {NAME!r} (register_backend)" in raised.value.__notes__
        return
    with pytest.raises((ValueError, TypeError)) as refused:
        _run(entry, seed)
    message = str(refused.value)
    assert message.startswith(f"backend {NAME!r}: its {method} ") and "\n" not in message, message
    assert re.search((FORWARD if where == "forward" else BACKWARD)[name][1], message), message


def test_a_backend_keeping_the_protocol_runs_unchanged():
    FaultyBackend.fault = ("neither", "")
    for entry in ("loss", "module", "logprobs"):
        _run(entry, 0)
