"""The GEMM path's CUDA data flow, on CPU, against the float64 reference: 16-bit GEMM operands, dZ narrowed to
16 bits in place by the Triton row kernel at its GPU block size (under the Triton interpreter), the dW waves added
into the float32 accumulator in place (wide_gemm.add_mm_wide_), the strided 16-bit dZ into torch.mm(out=...) for
dH. Only cuBLAS is left out: its float32-output GEMMs of 16-bit operands are float32 GEMMs of the same 16-bit
values here (backends/gemm.py's module doc); the Triton fallback for the dW adds has its own test below."""

import functools

import pytest
import torch
from grpo_testing import as_float64, assert_output_matches, make_problem, run_loss

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, reference
from grpo_kernels.backends import gemm, wide_gemm
from grpo_kernels.backends.gemm import GemmBackend, RowOps, triton_rows, wave_rows
from grpo_kernels.kernels import rows
from grpo_kernels.kernels.rows import GPU_BLOCK_V

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="runs the CUDA flow under the Triton interpreter, "
                                                                  "which is on only without CUDA")

TOKEN_LEVEL = GRPOLossConfig(loss_type="dapo", beta=0.04, entropy_coef=0.05)  # one pass, entropy gradient on
SEQUENCE_LEVEL = GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence", beta=0.04)  # two passes
V = 2500  # three 1024-wide chunks per row at the GPU block size, the last one partial
WAVE_ROWS = 5


class _RecordingGrid:
    """Stands in for a @triton.jit kernel and records the BLOCK_V of each launch."""

    def __init__(self, kernel, blocks: list):
        self._kernel, self._blocks = kernel, blocks

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self._blocks.append(kwargs["BLOCK_V"])
            return self._kernel[grid](*args, **kwargs)
        return launch


class _Flow:
    """Runs the loss API's GEMM backend with CUDA's choices and records what it did: each dZ the row pass
    returned, the row kernels' block sizes, and the dW waves the Triton GEMM added."""

    def __init__(self, monkeypatch):
        self.dz: list[tuple] = []
        self.blocks: list[int] = []
        self.accumulated = 0
        for name in ("_row_stats_kernel", "_row_grad_kernel"):
            monkeypatch.setattr(rows, name, _RecordingGrid(getattr(rows, name), self.blocks))
        gpu_rows = triton_rows(gpu_launch=True)

        def grad_(z, *args):
            dz = gpu_rows.grad_(z, *args)
            self.dz.append((dz.dtype, dz.stride(), dz.data_ptr() == z.data_ptr()))
            return dz

        add = wide_gemm.add_mm_wide_

        def add_mm_wide_(acc, a, b):
            assert acc.dtype == torch.float32 and a.dtype == b.dtype != torch.float32  # 16-bit into float32
            self.accumulated += 1
            return add(acc, a, b)

        monkeypatch.setattr(gemm, "add_mm_wide_", add_mm_wide_)
        monkeypatch.setattr(gemm, "GemmBackend", functools.partial(
            GemmBackend, rows=RowOps(gpu_rows.stats, grad_), gemm_in_input_dtype=True))


@pytest.mark.parametrize("config", [TOKEN_LEVEL, SEQUENCE_LEVEL], ids=["token", "sequence"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_data_flow_matches_float64(monkeypatch, config, dtype):
    flow = _Flow(monkeypatch)
    problem = make_problem(seed=21, B=2, T=8, H=32, V=V, dtype=dtype, importance_ratio="token")
    workspace_bytes = WAVE_ROWS * 4 * V
    assert wave_rows(V, workspace_bytes) == WAVE_ROWS
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend="gemm", workspace_bytes=workspace_bytes)
    ref_out, ref_grads = run_loss(reference.fused_linear_grpo_loss, as_float64(problem), config)
    assert_output_matches(out, grads, ref_out, ref_grads, dtype)

    # what was checked is CUDA's flow: 16-bit dZ over the float32 logits in >= 3 waves, dW added in place, the
    # row kernels at the GPU's block size
    assert len(flow.dz) >= 3
    assert all(dz_dtype == dtype and stride == (2 * V, 1) and in_place for dz_dtype, stride, in_place in flow.dz)
    assert flow.accumulated == len(flow.dz) - 1  # every wave after the first
    assert flow.blocks and set(flow.blocks) == {GPU_BLOCK_V}


def test_strided_16_bit_dz_into_mm_out():
    """dH = dZ W for a wave, as the flow writes it: the narrowed dZ (row stride 2V) times W into a row slice."""
    gen = torch.Generator().manual_seed(22)
    N, H = 6, 16
    workspace = torch.full((N, V), float("nan"))
    dz = workspace.view(torch.bfloat16)[:, :V]  # as row_grad_ returns it: in the first half of each float32 row
    dz.copy_(torch.randn(N, V, generator=gen))
    w = torch.randn(V, H, generator=gen).bfloat16()
    grad_hidden = torch.zeros(2 * N, H, dtype=torch.bfloat16)
    torch.mm(dz, w, out=grad_hidden[N:])
    expected = dz.double() @ w.double()
    assert torch.equal(grad_hidden[:N], torch.zeros(N, H, dtype=torch.bfloat16))
    scale = float(expected.abs().max())
    torch.testing.assert_close(grad_hidden[N:].double(), expected, rtol=2 ** -7, atol=1e-3 * scale)
