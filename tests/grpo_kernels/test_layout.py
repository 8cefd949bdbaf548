"""Padding-free rows and packed batches: only valid tokens go through the head, and a packed batch (hidden [N, H]
with cu_seqlens) gives exactly what its padded form gives."""

import pytest
import torch
from grpo_testing import device_of, make_problem, registered_backends

from grpo_kernels import GRPOLossConfig, LogitTransform, fused_linear_grpo_loss, linear_logprobs
from grpo_kernels.backends import gemm as gemm_path
from grpo_kernels.backends import torch_streaming as torch_chunked

CONFIGS = {
    "dapo_kl_entropy": GRPOLossConfig(beta=0.04, entropy_coef=0.02),
    "gspo": GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence"),
    "vespo": GRPOLossConfig(loss_type="vespo", beta=0.04),
    "entropy_mask": GRPOLossConfig(loss_type="bnpo", top_entropy_quantile=0.5),
    "softcapped_dapo_kl_entropy": GRPOLossConfig(beta=0.04, entropy_coef=0.02),
    "softcapped_gspo": GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence"),
}
# a Gemma-style head: packing must not change what the transform sees
TRANSFORMS = {"softcapped_dapo_kl_entropy": LogitTransform(scale=1.3, softcap=2.0),
              "softcapped_gspo": LogitTransform(scale=1.3, softcap=2.0)}
TRITON_CASES = ("dapo_kl_entropy", "softcapped_dapo_kl_entropy")  # the interpreter is slow: these cover it


def _right_padded(seed: int, lengths: list[int], H: int = 12, V: int = 45, device: str = "cpu"):
    problem = make_problem(seed=seed, B=len(lengths), T=max(lengths), H=H, V=V, with_bias=True, device=device,
                           importance_ratio="token", token_advantages=True)
    mask = torch.zeros_like(problem.completion_mask)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
    problem.completion_mask = mask
    return problem


def _packed(problem, lengths):
    """The packed form of a right-padded problem: valid tokens back to back."""
    keep = problem.completion_mask.reshape(-1) != 0
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), device=keep.device)

    def pack(x):
        return None if x is None else x.reshape(-1)[keep]
    return dict(hidden=problem.hidden.reshape(-1, problem.hidden.shape[-1])[keep], ids=pack(problem.completion_ids),
                old=pack(problem.old_logps), ref=pack(problem.ref_logps), rho=pack(problem.importance_ratio),
                adv=pack(problem.advantages), cu=cu, keep=keep)


def _grads(out, leaves):
    out.loss.backward()
    return [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("backend", registered_backends())
@pytest.mark.parametrize("name", list(CONFIGS))
def test_packed_equals_padded(backend, name):
    if backend == "triton" and name not in TRITON_CASES:
        pytest.skip("the interpreter is slow: the TRITON_CASES cover the Triton path")
    config, lengths = CONFIGS[name], [5, 1, 3, 7]
    head = dict(logit_transform=TRANSFORMS[name]) if name in TRANSFORMS else {}
    problem = _right_padded(seed=3, lengths=lengths, device=device_of(backend))
    w1, w2 = (problem.weight.clone().requires_grad_() for _ in range(2))
    h_pad = problem.hidden.clone().requires_grad_()
    padded = fused_linear_grpo_loss(h_pad, w1, problem.completion_ids, problem.completion_mask, problem.advantages,
                                    bias=problem.bias, old_logps=problem.old_logps, ref_logps=problem.ref_logps,
                                    importance_ratio=problem.importance_ratio, config=config, backend=backend, **head)
    p = _packed(problem, lengths)
    h_packed = p["hidden"].clone().requires_grad_()
    packed = fused_linear_grpo_loss(h_packed, w2, p["ids"], None, p["adv"], bias=problem.bias, old_logps=p["old"],
                                    ref_logps=p["ref"], importance_ratio=p["rho"], config=config, backend=backend,
                                    cu_seqlens=p["cu"], **head)
    torch.testing.assert_close(packed.loss, padded.loss, rtol=1e-5, atol=1e-6)
    for key, value in padded.metrics.items():
        torch.testing.assert_close(packed.metrics[key], value, rtol=1e-5, atol=1e-6)
    assert packed.logps.shape == (sum(lengths),)
    torch.testing.assert_close(packed.logps, padded.logps.reshape(-1)[p["keep"]])
    assert float(padded.logps.reshape(-1)[~p["keep"]].abs().max()) == 0.0  # padding reports log-prob 0
    grad_pad, grad_w1 = _grads(padded, [h_pad, w1])
    grad_packed, grad_w2 = _grads(packed, [h_packed, w2])
    torch.testing.assert_close(grad_packed, grad_pad.reshape(-1, grad_pad.shape[-1])[p["keep"]], rtol=1e-5, atol=1e-6)
    assert float(grad_pad.reshape(-1, grad_pad.shape[-1])[~p["keep"]].abs().max()) == 0.0
    torch.testing.assert_close(grad_w2, grad_w1, rtol=1e-5, atol=1e-6)


def test_packed_with_its_own_completion_mask():
    """A packed batch whose mask drops tokens (tool outputs) equals the padded batch with the same mask."""
    problem = make_problem(seed=6, B=3, T=6, H=10, V=33)
    B, T = problem.completion_mask.shape
    cu = torch.arange(0, B * T + 1, T)
    kwargs = dict(old_logps=problem.old_logps, ref_logps=problem.ref_logps, config=GRPOLossConfig(beta=0.04))
    padded = fused_linear_grpo_loss(problem.hidden, problem.weight, problem.completion_ids, problem.completion_mask,
                                    problem.advantages, **kwargs)
    packed = fused_linear_grpo_loss(problem.hidden.reshape(B * T, -1), problem.weight,
                                    problem.completion_ids.reshape(-1), problem.completion_mask.reshape(-1),
                                    problem.advantages, cu_seqlens=cu,
                                    **{**kwargs, "old_logps": problem.old_logps.reshape(-1),
                                       "ref_logps": problem.ref_logps.reshape(-1)})
    torch.testing.assert_close(packed.loss, padded.loss)
    torch.testing.assert_close(packed.logps, padded.logps.reshape(-1))


@pytest.mark.parametrize("backend,passes", [
    ("gemm", [(gemm_path, "_stream"), (gemm_path, "stream_sequence_waves")]),
    ("torch", [(torch_chunked, "linear_forward")])], ids=["gemm", "torch"])
def test_padding_never_goes_through_the_head(monkeypatch, backend, passes):
    rows_seen = []

    def spy(original):
        def run(hidden, *args, **kwargs):
            rows_seen.append(hidden.shape[0])
            return original(hidden, *args, **kwargs)
        return run
    for module, name in passes:  # every pass of the backend over the head's rows
        monkeypatch.setattr(module, name, spy(getattr(module, name)))
    problem = _right_padded(seed=1, lengths=[8, 2, 2, 4])
    config = GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence")
    hidden = problem.hidden.clone().requires_grad_()
    out = fused_linear_grpo_loss(hidden, problem.weight, problem.completion_ids, problem.completion_mask,
                                 problem.advantages, old_logps=problem.old_logps, config=config, backend=backend)
    out.loss.backward()
    assert rows_seen and set(rows_seen) == {16}, f"rows through the head: {rows_seen} (32 positions, 16 valid)"
    with torch.no_grad():
        rows_seen.clear()
        linear_logprobs(problem.hidden, problem.weight, problem.completion_ids, mask=problem.completion_mask,
                        backend=backend)
        assert rows_seen == [16]


@pytest.mark.parametrize("backend", ["gemm", "torch", "reference"])
def test_linear_logprobs_mask(backend):
    problem = make_problem(seed=2, B=3, T=5, H=8, V=30)
    full, full_ent = linear_logprobs(problem.hidden, problem.weight, problem.completion_ids, return_entropy=True,
                                     backend=backend)
    masked, masked_ent = linear_logprobs(problem.hidden, problem.weight, problem.completion_ids, return_entropy=True,
                                         backend=backend, mask=problem.completion_mask)
    keep = problem.completion_mask != 0
    torch.testing.assert_close(masked[keep], full[keep])
    torch.testing.assert_close(masked_ent[keep], full_ent[keep])
    assert float(masked[~keep].abs().max()) == 0.0 and float(masked_ent[~keep].abs().max()) == 0.0
    with pytest.raises(ValueError, match=r"mask must have shape \[B, T\]=\[3, 5\], got \[3, 2\]"):
        linear_logprobs(problem.hidden, problem.weight, problem.completion_ids, mask=problem.completion_mask[:, :2])


@pytest.mark.parametrize("cu,message", [
    (torch.tensor([0, 3, 2, 5]), "never decrease"),
    (torch.tensor([1, 3, 5]), "start at 0"),
    (torch.tensor([0, 3, 6]), "end at N=5"),
    (torch.tensor([0.0, 5.0]), "integer tensor"),
    (torch.tensor([[0, 5]]), r"\[S \+ 1\]"),
])
def test_bad_cu_seqlens_is_named(cu, message):
    hidden, weight = torch.randn(5, 4), torch.randn(9, 4)
    ids = torch.zeros(5, dtype=torch.long)
    with pytest.raises((ValueError, TypeError), match=message):
        fused_linear_grpo_loss(hidden, weight, ids, None, torch.zeros(2), cu_seqlens=cu)


def test_packed_shapes_are_checked():
    hidden, weight = torch.randn(5, 4), torch.randn(9, 4)
    cu = torch.tensor([0, 2, 5])
    with pytest.raises(ValueError, match="completion_ids must have shape"):
        fused_linear_grpo_loss(hidden, weight, torch.zeros(4, dtype=torch.long), None, torch.zeros(2), cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"completion_mask must have shape \[N\]"):
        fused_linear_grpo_loss(hidden, weight, torch.zeros(5, dtype=torch.long), torch.ones(4), torch.zeros(2),
                               cu_seqlens=cu)
    with pytest.raises(ValueError, match="hidden must be packed"):
        fused_linear_grpo_loss(hidden[None], weight, torch.zeros(5, dtype=torch.long), None, torch.zeros(2),
                               cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"old_logps must be \[N\]=\[5\]"):
        fused_linear_grpo_loss(hidden, weight, torch.zeros(5, dtype=torch.long), None, torch.zeros(2),
                               old_logps=torch.zeros(2, 3), cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"advantages must be \[S\]=\[2\]"):
        fused_linear_grpo_loss(hidden, weight, torch.zeros(5, dtype=torch.long), None, torch.zeros(3), cu_seqlens=cu)
