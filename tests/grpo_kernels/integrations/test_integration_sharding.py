"""The LM head is used whole under ZeRO-3 / FSDP2, and a shard is never used silently.

DeepSpeed ZeRO-3 is simulated: `FakeZero3` keeps each parameter at numel 0 outside a gather, exactly the
state ZeRO-3 leaves a partitioned parameter in, and counts the gathers. The kernels recompute the logits
from the weight in their backward, so the test also shows the gather is re-entered for the backward.
"""

from __future__ import annotations

import pytest
import torch
from process_groups import world_of_one  # noqa: F401  (a fixture)
from torch import nn

from grpo_kernels import linear_logprobs
from grpo_kernels.integrations import sharding
from grpo_kernels.integrations.sharding import call_with_full_head

V, H = 23, 8


class FakeZero3:
    """Partitions params to numel 0; `factory` hands out gathers the way `GatheredParameters` works."""

    def __init__(self, params):
        self.full = {id(p): p.data for p in params}
        self.enters = self.exits = 0
        for p in params:
            p.data = torch.empty(0, dtype=p.dtype)

    def factory(self, params):
        partitioned = [p for p in params if p.numel() == 0]
        if not partitioned:
            return None
        fake = self

        class Gathered:
            def __enter__(self):
                fake.enters += 1
                for p in partitioned:
                    p.data = fake.full[id(p)]

            def __exit__(self, *exc):
                fake.exits += 1
                for p in partitioned:
                    p.data = torch.empty(0, dtype=p.dtype)

        return Gathered()


def _head_and_inputs(bias: bool):
    torch.manual_seed(0)
    head = nn.Linear(H, V, bias=bias)
    hidden = torch.randn(2, 5, H, requires_grad=True)
    targets = torch.randint(0, V, (2, 5))
    return head, hidden, targets


def _loss(hidden, weight, bias, targets):
    logps, entropy = linear_logprobs(hidden, weight, targets, bias=bias, return_entropy=True, backend="torch")
    return (logps * torch.arange(5.0)).sum() + entropy.sum()


@pytest.mark.parametrize("bias", [False, True])
def test_zero3_partitioned_head_is_gathered_for_forward_and_backward(bias):
    head, hidden, targets = _head_and_inputs(bias)
    expected = _loss(hidden, head.weight, head.bias, targets)
    expected.backward()
    expected_grads = [hidden.grad.clone()] + [p.grad.clone() for p in head.parameters()]
    hidden.grad = None
    head.zero_grad(set_to_none=True)

    zero3 = FakeZero3(list(head.parameters()))
    loss = call_with_full_head(lambda h, w, b: _loss(h, w, b, targets), hidden, head, gather_factory=zero3.factory)
    assert zero3.enters == zero3.exits == 1 and head.weight.numel() == 0  # partitioned again after the forward
    loss.backward()
    assert zero3.enters == zero3.exits == 2 and head.weight.numel() == 0  # gathered once more for the backward
    torch.testing.assert_close(loss, expected)
    for actual, wanted in zip([hidden.grad] + [p.grad for p in head.parameters()], expected_grads):
        torch.testing.assert_close(actual, wanted)


def test_zero3_backward_without_the_second_gather_fails(monkeypatch):
    # The control for the test above: the backward really reads the weight, so skipping the re-gather breaks it.
    monkeypatch.setattr(sharding._BackwardGather, "enter", lambda self, grad: None)
    head, hidden, targets = _head_and_inputs(bias=False)
    zero3 = FakeZero3(list(head.parameters()))
    loss = call_with_full_head(lambda h, w, b: _loss(h, w, b, targets), hidden, head,
                               gather_factory=zero3.factory)
    with pytest.raises(RuntimeError):
        loss.backward()


def test_zero3_frozen_hidden_still_leaves_the_gather():
    # Hidden states without grad (a frozen backbone): the gather must still end after the kernel's backward.
    head, hidden, targets = _head_and_inputs(bias=False)
    zero3 = FakeZero3(list(head.parameters()))
    loss = call_with_full_head(lambda h, w, b: _loss(h, w, b, targets), hidden.detach(), head,
                               gather_factory=zero3.factory)
    loss.backward()
    assert zero3.enters == zero3.exits == 2 and head.weight.grad.shape == (V, H)


def test_zero3_no_grad_forward_gathers_once():
    head, hidden, targets = _head_and_inputs(bias=True)
    zero3 = FakeZero3(list(head.parameters()))
    with torch.no_grad():
        call_with_full_head(lambda h, w, b: _loss(h, w, b, targets), hidden, head, gather_factory=zero3.factory)
    assert zero3.enters == zero3.exits == 1


def test_a_shard_is_refused_not_used():
    head, hidden, targets = _head_and_inputs(bias=True)
    head.weight.data = head.weight.data[: V // 2]  # what an FSDP1 / tensor-parallel shard looks like
    with pytest.raises(RuntimeError, match="looks sharded"):
        call_with_full_head(lambda h, w, b: _loss(h, w, b, targets), hidden, head)
    head, hidden, targets = _head_and_inputs(bias=True)
    head.bias.data = head.bias.data[:3]
    with pytest.raises(RuntimeError, match="lm_head.bias has shape"):
        call_with_full_head(lambda h, w, b: _loss(h, w, b, targets), hidden, head)


def test_vocab_parallel_head_is_told_from_an_fsdp2_shard(world_of_one):
    # transformers 5.23's tensor-parallel plans shard the head on a ("tp",) mesh, 5.17's on an unnamed one, as
    # FSDP2 does by default: only a caller that knows the model is tensor-parallel can tell the last two apart
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    def head_on(mesh, placement):
        head = nn.Linear(H, V, bias=False)
        head.weight = nn.Parameter(distribute_tensor(head.weight.detach(), mesh, [placement]))
        return head

    named, unnamed = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",)), init_device_mesh("cpu", (1,))
    assert sharding.is_vocab_parallel_head(head_on(named, Shard(0)))
    assert not sharding.is_vocab_parallel_head(head_on(unnamed, Shard(0)))  # an FSDP2 shard: gathered
    assert sharding.is_vocab_parallel_head(head_on(unnamed, Shard(0)), tensor_parallel_model=True)
    assert not sharding.is_vocab_parallel_head(head_on(named, Replicate()), tensor_parallel_model=True)
    assert not sharding.is_vocab_parallel_head(nn.Linear(H, V), tensor_parallel_model=True)


def test_fsdp2_dtensor_head_is_all_gathered_differentiably(world_of_one):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    head, hidden, targets = _head_and_inputs(bias=False)
    expected = _loss(hidden, head.weight, None, targets)
    expected.backward()
    expected_grad = head.weight.grad.clone()

    mesh = init_device_mesh("cpu", (1,))
    head.weight = nn.Parameter(distribute_tensor(head.weight.detach(), mesh, [Shard(0)]))
    assert isinstance(head.weight, DTensor)
    loss = call_with_full_head(lambda h, w, b: _loss(h, w, b, targets), hidden, head)
    loss.backward()
    torch.testing.assert_close(loss, expected)
    assert isinstance(head.weight.grad, DTensor)  # the gradient lands on the sharded parameter
    torch.testing.assert_close(head.weight.grad.full_tensor(), expected_grad)


@pytest.mark.slow
def test_fsdp2_head_gradient_is_averaged_over_data_parallel_ranks(tmp_path):
    """2 gloo processes, each on its own data (tests/support/fsdp2_head_worker.py)."""
    import fsdp2_head_worker
    import torch.multiprocessing as mp

    mp.spawn(fsdp2_head_worker.run, args=(2, str(tmp_path / "init")), nprocs=2, join=True)
