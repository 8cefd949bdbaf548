"""benchmarks/triton_check.py's exactness part, on CPU under the Triton interpreter at a tiny shape: the GPU script's
own checks (loss, gradients, log-probs against float64, batch invariance, a repeatable backward) pass there."""

import pytest

from benchmarks.triton_check import check_exact
from grpo_kernels.kernels.configs import GPU_CONFIGS, SIXTEEN_BIT, KernelConfig


def test_check_exact_passes_interpreted():
    assert check_exact(B=2, T=9, H=32, V=70, device="cpu") == []


def test_persistent_tile_sweep_runs_interpreted():
    """(d) at a tiny shape on CPU: every Hopper variant (the GPU tiles, interpreted) builds, runs and gives the table
    entry's log-probs; a variant that cannot run is a failure line naming it, not the end of the sweep."""
    import time

    from benchmarks.triton_check import describe, persistent_variants, time_persistent_variants

    def wall(fn):
        started = time.perf_counter()
        fn()
        return (time.perf_counter() - started) * 1e3

    variants = persistent_variants()
    assert variants[0] == GPU_CONFIGS["sm90"]["persistent"][SIXTEEN_BIT]
    assert len(set(variants)) == len(variants)
    assert all(v.block_v * v.split_tiles == variants[0].block_v * variants[0].split_tiles for v in variants)
    rows, failures = time_persistent_variants({"tiny": (40, 64, 300)}, variants, device="cpu", timer=wall)
    assert failures == []
    assert [what for what, *_ in rows[1:]] == [f"tiny no-grad log-probs, persistent {describe(v)}" for v in variants]
    broken = KernelConfig(128, 96, 64, split_tiles=3)  # a vocabulary tile that is not a power of two cannot build
    rows, failures = time_persistent_variants({"tiny": (40, 64, 300)}, (variants[0], broken), device="cpu",
                                              timer=wall)
    assert len(rows) == 2 and len(failures) == 1 and describe(broken) in failures[0]


def test_parts_argument_refuses_unknown_letters(capsys):
    from benchmarks.triton_check import main

    with pytest.raises(SystemExit) as exit_:
        main(["--parts", "ax"])
    assert exit_.value.code == 2 and "--parts: expected letters of abcd, got 'ax'" in capsys.readouterr().err
