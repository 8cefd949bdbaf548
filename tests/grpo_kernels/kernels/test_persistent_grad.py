"""The persistent TMA kernel that forms dLoss/d(raw logits) in its epilogue (kernels/persistent_grad.py) under the
interpreter, against float64 autograd: slices of the vocabulary that start inside a tile and end inside one
(N 45 over 16-token blocks, V 300 over 32-column tiles, H 40 padded to the K block), with and without bias and the
entropy term, soft-capped heads, targets outside the shard, float32 / bfloat16 / float16 inputs and dz buffers;
nothing written outside the slice's [N, columns]; bitwise repeatable whatever the number of persistent programs."""

import pytest
import torch
from linear_head_cases import SOFTCAPPED, TEMPERATURE, float64_stats, forward_args, inputs

from grpo_kernels.head import IDENTITY
from grpo_kernels.kernels import launch, persistent_grad

pytestmark = pytest.mark.interpreter
N, V = 45, 300
# one rounding of dz to the buffer's dtype, after float32 arithmetic (the interpreter truncates to bf16 where a GPU
# rounds to nearest: 2^-7 relative)
ROUNDING = {torch.float32: 2e-5, torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}


def _float64_dz(hidden, weight, bias, targets, g, e, transform):
    """dLoss/d(raw logits) of sum(g lp + e entropy), float64 autograd through the head's transform (as
    linear_head_cases.float64_grads, at the logits)."""
    raw = (hidden.double() @ weight.double().T + (0.0 if bias is None else bias.double())).requires_grad_()
    z = transform.apply(raw) / TEMPERATURE
    log_p = torch.log_softmax(z, -1)
    # a target outside this vocabulary (a shard's) has no logit here; its lp still takes this shard's lse
    in_shard = (targets >= 0) & (targets < V)
    logps = torch.where(in_shard, z.gather(1, targets.clamp(0, V - 1)[:, None])[:, 0], 0.0) - torch.logsumexp(z, -1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    (g * logps + (0.0 if e is None else e * entropy)).sum().backward()
    return raw.grad


def _dz(hidden, weight, bias, targets, g, e, transform, v0, columns, dtype):
    """The kernel's dz of columns [v0, v0 + columns) in a buffer of `dtype` filled with 7s, 8 columns or more wider
    (rows of whole 16-byte units, as a descriptor store needs)."""
    _, entropy, lse, _ = float64_stats(hidden, weight, bias, targets, transform)
    per_16_bytes = 16 // dtype.itemsize
    buffer = torch.full((N, -(-(columns + 8) // per_16_bytes) * per_16_bytes), 7.0, dtype=dtype)
    h, head, y = forward_args(hidden, weight, bias, targets, transform)
    out = launch.persistent_dz(h, head, y, lse.float(), entropy.float(), g.float(),
                               None if e is None else e.float(), v0, buffer[:, :columns])
    assert out.data_ptr() == buffer.data_ptr()
    return buffer


@pytest.mark.parametrize("transform", [IDENTITY, SOFTCAPPED], ids=["plain", "softcapped"])
@pytest.mark.parametrize("with_bias,entropy_term", [(True, True), (False, False)], ids=["bias-entropy", "plain"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dz_of_a_vocabulary_slice_matches_float64(dtype, with_bias, entropy_term, transform):
    (hidden, weight, bias), targets, g, e = inputs(seed=11, N=N, V=V, dtype=dtype, with_bias=with_bias,
                                                   out_of_shard=6)
    e = e if entropy_term else None
    targets[10] = 77  # a target inside the slice below, and one in the slice's first, partial tile
    targets[11] = 40
    expected = _float64_dz(hidden, weight, bias, targets, g, e, transform)
    for v0, columns in ((0, 300), (40, 200), (270, 30)):
        buffer = _dz(hidden, weight, bias, targets, g, e, transform, v0, columns, dtype)
        reference = expected[:, v0:v0 + columns]
        # float32 arithmetic on the inputs as rounded to their dtype; then one rounding to the buffer's dtype
        err = (buffer[:, :columns].double() - reference).abs()
        assert (err <= ROUNDING[dtype] * reference.abs() + 2e-6 * float(reference.abs().max())).all(), \
            f"{v0}:{v0 + columns}: max error {float(err.max()):.3g}"
        assert (buffer[:, columns:] == 7.0).all()  # nothing written past the slice


def test_dz_is_bitwise_the_same_whatever_the_number_of_programs(monkeypatch):
    (hidden, weight, bias), targets, g, e = inputs(seed=12, N=N, V=V, dtype=torch.bfloat16)
    first = _dz(hidden, weight, bias, targets, g, e, IDENTITY, 40, 200, torch.bfloat16)
    monkeypatch.setattr(persistent_grad, "programs_for", lambda device, items, per_sm=1: 1)
    assert torch.equal(_dz(hidden, weight, bias, targets, g, e, IDENTITY, 40, 200, torch.bfloat16), first)
