"""Guard rail: the fused torch path's peak extra memory does not grow with the vocabulary at fixed N.

Measured as the peak RSS of a fresh process (benchmarks.suite.memory), so nothing the allocator or an earlier
test kept alive can hide a [tokens, vocab] tensor. The eager reference is measured the same way as a
control: it must grow by at least one [N, V] float32 tensor, or the instrument could not see growth.
"""

import os

import pytest

from benchmarks.suite import memory
from benchmarks.suite.inputs import make_inputs, save_inputs
from benchmarks.suite.shapes import BenchShape, LMHead

pytestmark = [pytest.mark.skipif(not memory.cpu_peak_rss_supported(),
                                 reason="needs Linux /proc/self/status VmHWM and /proc/self/clear_refs"),
              pytest.mark.usefixtures("cpu_only_subprocesses")]  # a CPU measurement, in a process of its own

TOKENS_B, TOKENS_T = 4, 512  # N = 2048 tokens, four of the torch backend's 512-token chunks
HIDDEN = 32  # small H: a [V, H] weight gradient is 1/64 of a [N, V] logits tensor
MIB = 2**20


def _peak_extra(tmp_path, path: str, vocab: int) -> int:
    shape = BenchShape(LMHead(f"scaling-V{vocab}", HIDDEN, vocab), TOKENS_B, TOKENS_T, "float32")
    inputs_file = os.path.join(tmp_path, f"inputs-{vocab}.pt")
    save_inputs(make_inputs(shape, "flat", "cpu", sample_from_policy=False), inputs_file)
    result = memory.cpu_peak_extra_bytes(memory.ProbeRequest(path, "loss", "dapo", inputs_file, threads=1))
    return result["peak_extra_bytes"]


def test_torch_backend_peak_memory_is_flat_in_vocab(tmp_path):
    small_vocab, large_vocab = 8192, 32768
    small = _peak_extra(tmp_path, "torch", small_vocab)
    large = _peak_extra(tmp_path, "torch", large_vocab)
    tokens = TOKENS_B * TOKENS_T
    extra_vocab = large_vocab - small_vocab
    logits_growth = tokens * extra_vocab * 4  # what materialising fp32 logits would add: 192 MiB
    # What legitimately grows with V: the [V, H] weight gradient and a few [V, H]-sized float32 buffers
    # (gradient accumulation, casts), plus allocator noise.
    allowed = 4 * extra_vocab * HIDDEN * 4 + 16 * MIB
    growth = large - small
    assert growth <= allowed, (
        f"torch backend peak extra memory grew by {growth / MIB:.1f} MiB from V={small_vocab} to V={large_vocab} "
        f"at N={tokens} (allowed {allowed / MIB:.1f} MiB; [N, V] float32 logits would add {logits_growth / MIB:.0f} MiB)")


def test_reference_peak_memory_grows_with_vocab(tmp_path):
    # The control: if this failed, the measurement could not tell a logits-sized allocation from noise.
    small_vocab, large_vocab = 4096, 16384
    small = _peak_extra(tmp_path, "reference", small_vocab)
    large = _peak_extra(tmp_path, "reference", large_vocab)
    one_logits_tensor = TOKENS_B * TOKENS_T * (large_vocab - small_vocab) * 4
    assert large - small >= one_logits_tensor, (
        f"reference peak extra memory grew by only {(large - small) / MIB:.1f} MiB, less than one "
        f"[N, V] float32 tensor ({one_logits_tensor / MIB:.0f} MiB): the RSS measurement is not working")
