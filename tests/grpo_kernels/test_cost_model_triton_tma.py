"""The cost model of the token-chunk backend (grpo_kernels/cost_model/triton_tma.py): the GEMM path's wave loop with
the persistent kernel in place of each wave's logits GEMM and row statistics, its chunks the backend's, its GEMM
count the design's (1 log-probs, 3 trained, 2 frozen, 4 sequence-level), and the kernel charged at the published
Triton fraction of cuBLAS's time at its shape plus the epilogue's exponentials."""

import pytest

from grpo_kernels.backends import get_backend
from grpo_kernels.backends.triton_tma import chunk_rows
from grpo_kernels.cost_model import paths
from grpo_kernels.cost_model.device import DEVICES
from grpo_kernels.cost_model.estimate import Problem
from grpo_kernels.cost_model.triton_tma import (EPILOGUE_EXPS_PER_LOGIT, SFU_RESULTS_PER_CLOCK_PER_SM, SM_CLOCK_HZ,
                                                TMA_TRITON_FRACTION_OF_CUBLAS, chunk_rows_modelled, triton_tma)
from grpo_kernels.kernels.configs import GPU_CONFIGS, SIXTEEN_BIT

H200 = DEVICES["H200"]
S1 = dict(tokens=8192, hidden=4096, vocab=151936)


def test_the_registry_entry_names_this_model():
    assert get_backend("triton_tma").cost_model() is triton_tma


@pytest.mark.parametrize("workspace", [1 << 20, 1 << 30, 3 << 29])
def test_chunks_are_the_backends(workspace):
    block = GPU_CONFIGS["sm90"]["persistent"][SIXTEEN_BIT].block_n
    assert chunk_rows_modelled(Problem(**S1, workspace_bytes=workspace)) == chunk_rows(151936, workspace, block)


@pytest.mark.parametrize("kw, gemms", [(dict(operation="logprobs"), 1), ({}, 3), (dict(frozen_head=True), 2),
                                       (dict(level="sequence"), 4)])
def test_gemm_equivalents_and_no_row_statistics_pass(kw, gemms):
    estimate = triton_tma(Problem(**S1, **kw))
    assert estimate.gemms == gemms
    assert not [ph for ph in estimate.phases if "row statistics" in ph.name or "GEMM1" in ph.name]
    assert sum(ph.count for ph in estimate.phases if "persistent" in ph.name) == \
        (1 if kw.get("operation") else -(-8192 // chunk_rows_modelled(Problem(**S1)))) + (kw.get("level") == "sequence")


def test_the_kernel_is_charged_at_the_published_fraction_of_cublas_plus_its_exponentials():
    p = Problem(**S1, operation="logprobs")
    (phase,) = triton_tma(p).phases
    cublas = paths.gemm_phase("floor", 8192, 151936, 4096, 2, 2).compute_seconds(H200)
    exps = EPILOGUE_EXPS_PER_LOGIT * 8192 * 151936 / (SFU_RESULTS_PER_CLOCK_PER_SM * H200.sms * SM_CLOCK_HZ)
    assert phase.compute_seconds(H200) == pytest.approx(cublas / TMA_TRITON_FRACTION_OF_CUBLAS + exps)
    assert TMA_TRITON_FRACTION_OF_CUBLAS == pytest.approx(700 / 780)


def test_the_chunk_loop_keeps_the_gemm_paths_backward_and_memory():
    p = Problem(**S1)
    ours = triton_tma(p)
    waves = paths.gemm(Problem(**S1, workspace_bytes=chunk_rows_modelled(p) * 4 * 151936))  # its waves: our chunks
    backward = [ph.name for ph in waves.phases if "GEMM1" not in ph.name and "row statistics" not in ph.name]
    assert [ph.name for ph in ours.phases if "persistent" not in ph.name] == backward
    assert ours.fp32_weight_grad_bytes == waves.fp32_weight_grad_bytes
    assert waves.peak_extra_bytes <= ours.peak_extra_bytes <= waves.peak_extra_bytes * 1.01
