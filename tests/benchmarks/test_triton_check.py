"""benchmarks/triton_check.py's exactness part, on CPU under the Triton interpreter at a tiny shape: the GPU script's
own checks (loss, gradients, log-probs against float64, batch invariance, a repeatable backward) pass there."""

from benchmarks.triton_check import check_exact


def test_check_exact_passes_interpreted():
    assert check_exact(B=2, T=9, H=32, V=70, device="cpu") == []
