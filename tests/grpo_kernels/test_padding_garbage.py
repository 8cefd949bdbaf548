"""Whatever a trainer leaves at the positions its mask excludes is never read: token ids outside [0, V) (-100, HF's
ignore index for labels, as Liger's chunked loss and TRL take them), and NaN / +-inf / huge values in the old and
reference log-probs, the vLLM importance ratios and [B, T] advantages. Each entry point gives the loss, gradient and
scored log-probs of the same batch with clean values there.

Before, an id outside [0, V) at a padded position was refused ("must hold token ids in [0, V)") like one at a
scored position, while Liger's LigerFusedLinearGRPOLoss computed the loss."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_kernels import (FusedLinearGRPOLoss, GRPOLossConfig, fused_linear_grpo_loss, grpo_loss_from_logits,
                          linear_logprobs)

B, T, H, V = 3, 5, 4, 7
GARBAGE_IDS = st.sampled_from([-100, -1, V, V + 3, -(2**40), 2**40])
GARBAGE_VALUES = st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 3e38])


def _batch(seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.rand(B, T, generator=gen) > 0.4).long()
    mask[0, 0] = 1  # something is scored
    return dict(hidden=torch.randn(B, T, H, generator=gen, dtype=torch.float64),
                weight=torch.randn(V, H, generator=gen, dtype=torch.float64),
                ids=torch.randint(0, V, (B, T), generator=gen), mask=mask,
                advantages=torch.randn(B, T, generator=gen, dtype=torch.float64),
                old=-torch.rand(B, T, generator=gen, dtype=torch.float64) - 0.1,
                ref=-torch.rand(B, T, generator=gen, dtype=torch.float64) - 0.1,
                ratio=torch.rand(B, T, generator=gen, dtype=torch.float64) + 0.5)


def _run(entry: str, b: dict, config: GRPOLossConfig) -> list[torch.Tensor]:
    """The values an entry point returns and its gradient, the log-probs only where the mask is 1."""
    hidden = b["hidden"].clone().requires_grad_()
    scored = b["mask"] != 0
    logps = None
    if entry == "loss":
        out = fused_linear_grpo_loss(hidden, b["weight"], b["ids"], b["mask"], b["advantages"], old_logps=b["old"],
                                     ref_logps=b["ref"], importance_ratio=b["ratio"], config=config, backend="torch")
        loss, logps = out.loss, out.logps
    elif entry == "packed":  # the same rows back to back, one sequence each
        cu = torch.arange(0, B * T + 1, T)
        flat = {k: b[k].reshape(-1) for k in ("ids", "mask", "advantages", "old", "ref", "ratio")}
        out = fused_linear_grpo_loss(hidden.reshape(B * T, H), b["weight"], flat["ids"], flat["mask"],
                                     flat["advantages"], old_logps=flat["old"], ref_logps=flat["ref"],
                                     importance_ratio=flat["ratio"], config=config, backend="torch", cu_seqlens=cu)
        loss, logps = out.loss, out.logps.reshape(B, T)
    elif entry == "logits":
        out = grpo_loss_from_logits(hidden @ b["weight"].T, b["ids"], b["mask"], b["advantages"], old_logps=b["old"],
                                    ref_logps=b["ref"], importance_ratio=b["ratio"], config=config, backend="torch")
        loss, logps = out.loss, out.logps
    elif entry == "logprobs":
        logps = linear_logprobs(hidden, b["weight"], b["ids"], mask=b["mask"], backend="torch")
        loss = (logps * scored).sum()
    else:  # Liger's module; its reference log-probs computed from ref_input under the same mask
        module = FusedLinearGRPOLoss(beta=config.beta, loss_type=config.loss_type, backend="torch")
        loss, _ = module(hidden, b["weight"], b["ids"], b["mask"], b["advantages"], old_per_token_logps=b["old"],
                         ref_input=b["hidden"] * 0.5, vllm_is_ratio=b["ratio"])
    (grad,) = torch.autograd.grad(loss, hidden)
    return [loss.detach(), grad] + ([] if logps is None else [logps.detach()[scored]])


@settings(max_examples=60, deadline=None)
@given(entry=st.sampled_from(["loss", "packed", "logits", "logprobs", "module"]),
       loss_type=st.sampled_from(["grpo", "dapo", "bnpo", "cispo", "sapo"]), beta=st.sampled_from([0.0, 0.04]),
       seed=st.integers(0, 2**16), data=st.data())
def test_garbage_where_the_mask_is_0_gives_the_clean_batch_s_answer(entry, loss_type, beta, seed, data):
    clean = _batch(seed)
    padded = torch.nonzero(clean["mask"] == 0).tolist()
    dirty = {k: v.clone() for k, v in clean.items()}
    for position in data.draw(st.lists(st.sampled_from(padded), min_size=1, unique_by=tuple), "positions") \
            if padded else []:
        position = tuple(position)
        dirty["ids"][position] = data.draw(GARBAGE_IDS, "id")
        for name in ("old", "ref", "advantages"):
            dirty[name][position] = data.draw(GARBAGE_VALUES, name)
        dirty["ratio"][position] = data.draw(st.sampled_from([float("nan"), float("inf"), 1e30]), "ratio")
    config = GRPOLossConfig(loss_type=loss_type, beta=beta)
    for got, want in zip(_run(entry, dirty, config), _run(entry, clean, config)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("entry", ["loss", "logits", "logprobs", "module"])
def test_an_id_outside_the_vocabulary_where_the_mask_is_1_is_refused_naming_it(entry):
    b = _batch(0)
    b["ids"][0, 0] = -100
    name = "selected_token_ids" if entry == "module" else "targets" if entry == "logprobs" else "completion_ids"
    with pytest.raises(ValueError, match=rf"^{name} must hold token ids in \[0, {V}\), got values in \[-100, "):
        _run(entry, b, GRPOLossConfig(beta=0.04))


def test_the_module_matches_liger_with_ignore_index_ids_at_padding():
    liger = pytest.importorskip("liger_kernel.chunked_loss")
    b = _batch(3)
    ids = b["ids"].masked_fill(b["mask"] == 0, -100)
    answers = []
    for module in (liger.LigerFusedLinearGRPOLoss(compiled=False), FusedLinearGRPOLoss(backend="torch")):
        hidden = b["hidden"].clone().requires_grad_()
        loss, _ = module(hidden, b["weight"], ids, b["mask"], b["advantages"][:, 0], ref_per_token_logps=b["ref"],
                         old_per_token_logps=b["old"])
        answers.append([loss.detach(), *torch.autograd.grad(loss, hidden)])
    for got, want in zip(answers[1], answers[0]):  # Liger computes in float32
        torch.testing.assert_close(got, want.double(), rtol=1e-5, atol=1e-6)
