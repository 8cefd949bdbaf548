"""Sizes past what the kernels index are refused by one line before any work, and a broadcast (stride-0) input is
scanned for NaN / Inf once per distinct element: an expanded [2**31 + k, H] head costs no memory, and ran for a
minute of scanning and streaming before failing to allocate its gradient."""

from __future__ import annotations

import os
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_kernels import fused_linear_grpo_loss, grpo_loss_from_logits, linear_logprobs
from grpo_kernels.validation import MAX_TOKEN_ROWS, MAX_VOCAB_SIZE

DERANDOMIZE = bool(os.environ.get("CI"))
H = 4


@settings(max_examples=20, deadline=None, derandomize=DERANDOMIZE)
@given(st.integers(MAX_VOCAB_SIZE + 1, 2**40), st.sampled_from(["reference", "torch", "gemm", "auto"]),
       st.sampled_from(["loss", "logprobs", "logits"]))
def test_a_vocabulary_past_int32_is_refused_before_any_work(vocab, backend, entry):
    ids, mask = torch.zeros(1, 2, dtype=torch.int64), torch.ones(1, 2)
    weight = torch.zeros(1, H).expand(vocab, H)  # no memory: every row is the same one
    started = time.perf_counter()
    with pytest.raises(ValueError) as caught:
        if entry == "loss":
            fused_linear_grpo_loss(torch.zeros(1, 2, H), weight, ids, mask, torch.zeros(1), backend=backend)
        elif entry == "logprobs":
            linear_logprobs(torch.zeros(1, 2, H), weight, ids, backend=backend)
        else:
            grpo_loss_from_logits(torch.zeros(1, 1, 1).expand(1, 2, vocab), ids, mask, torch.zeros(1),
                                  backend="reference" if backend == "reference" else "auto")
    assert time.perf_counter() - started < 5.0
    name = "logits" if entry == "logits" else "weight"
    assert str(caught.value).startswith(f"{name} has a vocabulary of {vocab} rows; at most 2**31 - 1")


@settings(max_examples=30, deadline=None, derandomize=DERANDOMIZE)
@given(st.integers(1, 3), st.integers(1, 4), st.sampled_from([float("nan"), float("inf"), None]),
       st.sampled_from(["hidden", "weight"]), st.integers(0, 1000))
def test_a_broadcast_input_is_checked_for_non_finite_values_and_gives_the_dense_answer(B, T, poison, which, seed):
    gen = torch.Generator().manual_seed(seed)
    V = 6
    dense = dict(hidden=torch.randn(1, 1, H, generator=gen).expand(B, T, H).clone(),
                 weight=torch.randn(1, H, generator=gen).expand(V, H).clone())
    if poison is not None:
        dense[which][..., 0] = poison
    expanded = dict(dense, **{which: dense[which][(slice(0, 1),) * (dense[which].dim() - 1)].expand(
        dense[which].shape)})
    ids, mask, advantages = torch.randint(0, V, (B, T), generator=gen), torch.ones(B, T), torch.randn(B, generator=gen)
    if poison is not None:
        with pytest.raises(ValueError, match=f"^{which} contains NaN or Inf values$"):
            fused_linear_grpo_loss(expanded["hidden"], expanded["weight"], ids, mask, advantages, backend="gemm")
        return
    got = fused_linear_grpo_loss(expanded["hidden"], expanded["weight"], ids, mask, advantages, backend="gemm")
    expected = fused_linear_grpo_loss(dense["hidden"].double(), dense["weight"].double(), ids, mask,
                                      advantages.double(), backend="reference")
    torch.testing.assert_close(got.loss.double(), expected.loss, rtol=1e-5, atol=1e-5)


@settings(max_examples=20, deadline=None, derandomize=DERANDOMIZE)
@given(st.integers(MAX_TOKEN_ROWS + 1, 2**40), st.integers(1, 4),
       st.sampled_from(["reference", "torch", "gemm", "auto"]), st.sampled_from(["loss", "logprobs", "logits"]))
def test_a_batch_past_int32_rows_is_refused_before_any_allocation(rows, split, backend, entry):
    """An expanded (stride-0) hidden or logits of 2**31 rows and more costs no memory until the log-probs' rows are
    gathered: it failed in the allocator (68 GB). The rows are numbered in int32 inside the kernels."""
    batch = (split, -(-rows // split)) if entry != "logprobs" or split > 1 else (rows,)
    count = batch[0] * batch[-1] if len(batch) == 2 else rows
    ids = torch.zeros((1,) * len(batch), dtype=torch.int64).expand(batch)
    started = time.perf_counter()
    with pytest.raises(ValueError) as caught:
        if entry == "loss":
            fused_linear_grpo_loss(torch.zeros(1, 1, H).expand(*batch, H), torch.zeros(5, H), ids,
                                   torch.ones(1, 1).expand(batch), torch.zeros(1).expand(batch[0]), backend=backend)
        elif entry == "logprobs":
            linear_logprobs(torch.zeros((1,) * len(batch) + (H,)).expand(*batch, H), torch.zeros(5, H), ids,
                            backend=backend)
        else:
            grpo_loss_from_logits(torch.zeros(1, 1, 5).expand(*batch, 5), ids, torch.ones(1, 1).expand(batch),
                                  torch.zeros(1).expand(batch[0]),
                                  backend="reference" if backend == "reference" else "auto")
    assert time.perf_counter() - started < 5.0
    name = "logits" if entry == "logits" else "hidden"
    assert str(caught.value) == (f"{name} has a batch (every dimension but the last) of {count} rows; at most "
                                 f"2**31 - 1 = {MAX_TOKEN_ROWS} are supported (row indices are int32 inside the "
                                 f"kernels)")
