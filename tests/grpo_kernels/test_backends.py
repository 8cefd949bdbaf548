"""The backends behind one Protocol and one registry: every backend and wrapper implements it (a backend added to
the registry is what the API runs, with no other edit: test_registry.py)."""

import pytest
import torch
from grpo_testing import with_triton_interpreted

import grpo_kernels.api as api
from grpo_kernels import LMHead, LogitTransform
from grpo_kernels.backends import BACKENDS, LogitsBackend, LogprobBackend, backend_names, get_backend, implementation
from grpo_kernels.backends.kept_tokens import KeptTokenHead
from grpo_kernels.backends.vocab_parallel import ShardBackend, VocabShard


def test_every_backend_and_wrapper_implements_the_protocol():
    for name in backend_names(with_auto=False):
        assert isinstance(get_backend(name).backend(1 << 20), LogprobBackend), name
        assert isinstance(get_backend(name).logits_backend(), LogitsBackend), name
    kept = implementation("torch", 1 << 20, kept_token_ids=torch.full((2, 3), -1))
    assert isinstance(kept, KeptTokenHead) and isinstance(kept, LogprobBackend)
    assert isinstance(ShardBackend(kept, VocabShard(group=None, sizes=(3, 4), rank=0)), LogprobBackend)
    assert not isinstance(object(), LogprobBackend)


def test_the_api_lists_the_registry_and_refuses_unknown_names_with_them():
    assert api.BACKENDS == ("auto", *BACKENDS)
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'reference', 'torch', 'triton', "
                                         r"'triton_atomic', 'triton_tma', 'gemm'\), got 'cuda'"):
        api.resolve_backend("cuda", torch.device("cpu"))


@pytest.mark.parametrize("name", with_triton_interpreted(list(BACKENDS)))
def test_each_backend_meets_the_protocol_against_float64(name):
    """Forward statistics and backward gradients through the Protocol alone, a target outside the rows (another
    shard's, -1) included, against autograd of the formula in float64."""
    gen = torch.Generator().manual_seed(9)
    hidden, weight, bias = (torch.randn(*shape, generator=gen) for shape in ((6, 16), (40, 16), (40,)))
    targets = torch.randint(0, 40, (6,), generator=gen)
    targets[2] = -1
    g, e = torch.randn(6, generator=gen), torch.randn(6, generator=gen)
    head = LMHead(weight, bias, 0.8, LogitTransform(scale=1.3, softcap=4.0))
    backend = get_backend(name).backend(1 << 20)
    logps, entropy, lse = backend.linear_forward(hidden, head, targets)
    dh, dw, db = backend.linear_backward(g, e, hidden, head, targets, lse, entropy)

    h64, w64, b64 = (x.double().requires_grad_() for x in (hidden, weight, bias))
    logits = LogitTransform(scale=1.3, softcap=4.0).apply(h64 @ w64.T + b64) / 0.8
    lse64 = torch.logsumexp(logits, -1)
    log_p = logits - lse64[:, None]
    ent64 = -(log_p.exp() * log_p).sum(-1)
    lp64 = torch.where(targets >= 0, logits.gather(-1, targets.clamp(min=0)[:, None]).squeeze(-1), 0.0) - lse64
    (g.double() * lp64 + e.double() * ent64).sum().backward()
    for got, want, what in ((logps, lp64, "logps"), (entropy, ent64, "entropy"), (lse, lse64, "lse"),
                            (dh, h64.grad, "dhidden"), (dw, w64.grad, "dweight"), (db, b64.grad, "dbias")):
        torch.testing.assert_close(got.double(), want.detach(), rtol=1e-4, atol=1e-5, msg=f"{name} {what}")
