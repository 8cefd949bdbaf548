"""Kernels that loop over a runtime bound run under the Triton interpreter whatever the triton / numpy pair
(triton 3.6's interpreter with numpy >= 2.4 needs grpo_kernels/kernels/interpreter_compat.py)."""

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the Triton interpreter runs only without CUDA")


def test_scalar_arguments_convert_to_loop_bounds():
    from grpo_kernels.kernels import interpreter_compat, rows  # noqa: F401  (importing a kernel module fixes)

    import triton.language as tl
    from triton.runtime import interpreter

    assert not interpreter_compat._index_fails(interpreter, tl)


def test_a_vocabulary_loop_of_several_chunks_runs_interpreted():
    from grpo_kernels.kernels import rows

    gen = torch.Generator().manual_seed(0)
    z = torch.randn(3, 600, generator=gen, dtype=torch.float64)
    targets = torch.tensor([0, 599, 17])
    lse, entropy, target_z = rows.row_stats(z.float(), None, targets, 1.0)  # 256-wide chunks: 3 iterations
    log_p = torch.log_softmax(z, -1)
    torch.testing.assert_close(lse.double(), torch.logsumexp(z, -1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(entropy.double(), -(log_p.exp() * log_p).sum(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(target_z.double(), z.gather(1, targets[:, None]).squeeze(1), rtol=1e-6, atol=1e-6)
