"""The cost model's GEMM rule and time rule, by hand: what a GEMM of few rows, a partial wave, a short K and each
launch cost (grpo_kernels/cost_model/device.py, estimate.py)."""

import math

import pytest

from grpo_kernels.cost_model import DEVICES, DeviceRates, Phase, gemm_compute_seconds

H100 = DEVICES["H100"]
RATE = H100.tensor_flops


def test_a_large_gemm_runs_at_the_cited_rate_but_for_each_tiles_k_fill():
    m, n, k = 128 * 132, 256, 8192  # exactly one wave of 132 tiles
    assert gemm_compute_seconds(m, n, k, RATE, H100) == pytest.approx(2 * m * n * (k + 128) / RATE)


def test_rows_round_up_to_whole_tiles_and_tiles_to_whole_waves():
    one_wave = gemm_compute_seconds(128 * 132, 256, 4096, RATE, H100)
    # 129 rows compute two tiles' rows: the same time as 256 rows
    assert gemm_compute_seconds(129, 256 * 66, 4096, RATE, H100) == gemm_compute_seconds(256, 256 * 66, 4096, RATE,
                                                                                          H100) == one_wave
    # 133 tiles take two waves, twice the time of 132
    assert gemm_compute_seconds(128 * 133, 256, 4096, RATE, H100) == pytest.approx(2 * one_wave)
    # so the achieved rate of a 441-row wave is 441/512 of a 512-row one's
    achieved = [2 * m * 151936 * 4096 / gemm_compute_seconds(m, 151936, 4096, RATE, H100) for m in (441, 512)]
    assert achieved[0] / achieved[1] == pytest.approx(441 / 512)


def test_few_tiles_and_a_long_k_split_k_over_the_idle_sms():
    # dH of a 128-row wave at H = 4096: 16 tiles, K = V = 151936: split 8 ways (132 // 16), one wave
    t = gemm_compute_seconds(128, 4096, 151936, RATE, H100)
    assert t == pytest.approx(132 * 2 * 128 * 256 * (math.ceil(151936 / 8) + 128) / RATE)
    assert t < gemm_compute_seconds(128, 4096, 151936, RATE, DeviceRates(**{**H100.__dict__, "gemm_k_fill": 0})) * 8


def test_a_phase_is_its_bound_plus_its_launches_and_syncs_per_repetition():
    rates = DeviceRates("unit", tensor_flops=1.0, fp32_flops=1.0, hbm_bytes_per_s=1.0, hbm_peak_bytes_per_s=1.0,
                        l2_bytes=0, sms=1, source="test", l2_bytes_per_s=2.0, kernel_launch_s=0.5, host_sync_s=3.0)
    assert Phase("x", flops=4, hbm_bytes=3, l2_bytes=10, count=2, launches=2, host_syncs=1).seconds(rates) == \
        pytest.approx(2 * (max(4, 3, 10 / 2) + 2 * 0.5 + 3.0))
    # the defaults time neither L2 nor launches nor tiles: 2mnk / rate
    plain = DeviceRates("plain", 1.0, 1.0, 1.0, 1.0, 0, 1, "test")
    assert Phase("g", flops=48, gemm_shape=(4, 3, 2), launches=1).seconds(plain) == 48


def test_every_registered_backend_has_a_cost_model():
    # auto routes by the model and the roofline prints it: a backend added to the registry needs its counts too
    from grpo_kernels.backends import BACKENDS
    from grpo_kernels.cost_model import library_paths

    assert set(library_paths()) == set(BACKENDS)
