"""benchmarks.model.roofline: a case counted by hand, and the model's sanity (frozen head, padding, two passes)."""

import dataclasses
import os
import re
from dataclasses import replace

import pytest

from benchmarks.model import roofline, roofline_paths
from benchmarks.model.roofline_model import DEVICES, DeviceRates, Problem
from benchmarks.model.roofline_paths import MODELS

# N=4 tokens, H=2, V=3, bf16 (c=2); a workspace of 24 bytes holds n_w = 24 // (4*3) = 2 rows: 2 waves.
TINY = Problem(tokens=4, hidden=2, vocab=3, dtype="bfloat16", workspace_bytes=24)
# 1 FLOP/s on tensor cores and 1 byte/s: every phase's time is max(FLOPs, bytes) in seconds.
UNIT = DeviceRates("unit", tensor_flops=1.0, fp32_flops=1.0, hbm_bytes_per_s=1.0, hbm_peak_bytes_per_s=1.0,
                   l2_bytes=0, sms=1, source="test")
GEMM_FLOPS = 2 * 4 * 2 * 3  # one [4, 2] x [2, 3] GEMM: 48


def test_gemm_path_by_hand():
    est = roofline.estimate("gemm", TINY)
    # Per wave (2 rows): GEMM1 reads h 2*2*2 + W 3*2*2, writes fp32 Z 2*3*4 = 44 B, 2*2*3*2 = 24 FLOPs;
    # statistics read Z 24 B + 2 rows * 64 B of per-token vectors; row gradient reads Z 24 B, writes dZ 2*3*2;
    # GEMM2 reads dZ 12 + W 12, writes dH 2*2*2 = 32 B; GEMM3 reads dZ 12 + h 8, writes fp32 dW 3*2*4 = 44 B.
    # Once: objective 4 * 64; the second wave's GEMM3 also reads the float32 accumulator it adds into (3*2*4);
    # cast dW (3*2*(4+2) = 36); backward scales dW (3*2*2*2 = 24) and dH (4*2*2*2 = 32).
    by_hand = 2 * (44 + 152 + 36 + 32 + 44) + 256 + 24 + 36 + 24 + 32
    assert by_hand == 988
    assert est.hbm_bytes == by_hand
    assert est.flops == 3 * GEMM_FLOPS == 144
    assert est.gemms == 3
    # every GEMM phase here is memory-bound at 1 FLOP/s = 1 B/s, so the time is the bytes
    assert est.seconds(UNIT) == pytest.approx(988)
    # at 0.5 FLOP/s the six GEMMs (24 FLOPs = 48 s each) become compute-bound: GEMM1 and GEMM2 +4 and +16 s per
    # wave, the first GEMM3 +4 s; the second GEMM3 moves 44 + 24 = 68 B and stays memory-bound
    half_rate = DeviceRates(**{**UNIT.__dict__, "tensor_flops": 0.5})
    assert est.seconds(half_rate) == pytest.approx(988 + 2 * (48 - 44) + 2 * (48 - 32) + (48 - 44))
    # workspace 2*3*4 + per-token vectors 4*64 (no dW temporary); dW copy 3*2*4
    assert est.peak_extra_bytes == 24 + 256
    assert est.fp32_weight_grad_bytes == 24


@pytest.mark.parametrize("problem", [TINY, Problem(tokens=8192, hidden=4096, vocab=151936, dtype="bfloat16")],
                         ids=["tiny", "S1"])
def test_the_floor_is_three_gemms_and_no_path_computes_less(problem):
    """The floor: the logits, dH and dW GEMMs, each reading its operands and writing its result once (c = 2 bytes);
    every modelled path does at least its arithmetic."""
    N, H, V = problem.tokens, problem.hidden, problem.vocab

    def gemm_bytes(m, n, k):
        return 2 * (m * k + k * n + m * n)

    floor = roofline.estimate("floor", problem)
    assert floor.hbm_bytes == gemm_bytes(N, V, H) + gemm_bytes(N, H, V) + gemm_bytes(V, H, N)
    assert floor.flops == 3 * 2 * N * H * V and floor.gemms == 3
    for path in MODELS:
        assert roofline.estimate(path, problem).flops >= floor.flops, path


def test_trl_head_by_hand():
    # [2, 2] tiles over N=4, V=3: two token chunks x (a 2-wide and a 1-wide vocabulary tile).
    est = roofline_paths.trl(TINY, token_chunk=2, vocab_chunk=2)
    # gather valid rows 2*4*2*2 = 32. Forward, 2-wide tiles (x2): GEMM reads h 8 + W 8, writes the bf16 tile 8,
    # the fold reads it 8 = 32; 1-wide tiles (x2): 8 + 4 + 4, fold 4 = 20. Per-token vectors 4 * 64.
    forward = 32 + 2 * 32 + 2 * 20 + 256
    # zero the float32 dH [4, 2] and dW [3, 2]: 4*2*(4 + 3) = 56. Backward, 2-wide tiles (x2): recompute 24,
    # dZ in place (read + write) 16, dH GEMM reads dZ 8 + W 8, writes fp32 16 and reads that accumulator 16 = 48,
    # dW GEMM reads dZ 8 + h 8, writes fp32 16, reads it 16 = 48; 1-wide tiles (x2): recompute 16, dZ 8,
    # dH 4 + 4 + 16 + 16 = 40, dW 4 + 8 + 8 + 8 = 28. Then cast dH 4*2*6, scatter dH 4*2*2 + 4*2*2, cast dW 3*2*6.
    backward = 56 + 2 * (24 + 16 + 48 + 48) + 2 * (16 + 8 + 40 + 28) + 48 + 32 + 36
    assert est.hbm_bytes == forward + backward == 1020
    assert est.flops == 4 * GEMM_FLOPS and est.gemms == 4  # the backward recomputes the logits
    # one [2, 2] bf16 tile buffer, the gathered h (bf16) and the float32 dH, the per-token vectors; dW apart
    assert est.peak_extra_bytes == 2 * 2 * 2 + 4 * 2 * 2 + 4 * 2 * 4 + 4 * 64
    assert est.fp32_weight_grad_bytes == 3 * 2 * 4
    logprobs = roofline_paths.trl(replace(TINY, operation="logprobs"), token_chunk=2, vocab_chunk=2)
    assert logprobs.hbm_bytes == forward and logprobs.gemms == 1


def test_frozen_head_removes_the_weight_gradient_gemm():
    frozen = Problem(tokens=4096, hidden=512, vocab=32768, frozen_head=True)
    trained = Problem(tokens=4096, hidden=512, vocab=32768)
    gemm_flops = trained.gemm_flops
    for path in ("floor", "gemm", "triton", "torch", "liger", "cce", "reference", "trl"):
        a, b = roofline.estimate(path, trained), roofline.estimate(path, frozen)
        dw_gemms = 2 if path == "triton" else 1  # the streaming dW kernel recomputes the logits too
        assert a.flops - b.flops == dw_gemms * gemm_flops, path
        assert b.fp32_weight_grad_bytes == 0 and b.hbm_bytes < a.hbm_bytes, path
    assert not any("GEMM3" in phase.name for phase in roofline.estimate("gemm", frozen).phases)


def test_padding_halves_the_work_of_padding_free_paths():
    full = Problem(tokens=8192, hidden=1024, vocab=65536, workspace_bytes=2**26)
    half = Problem(tokens=8192, hidden=1024, vocab=65536, workspace_bytes=2**26, valid_fraction=0.5)
    for path in ("gemm", "triton", "torch", "trl"):
        a, b = roofline.estimate(path, full), roofline.estimate(path, half)
        assert b.flops == pytest.approx(a.flops / 2), path
        assert b.seconds(DEVICES["H100"]) < 0.6 * a.seconds(DEVICES["H100"]), path
    for path in ("floor", "reference", "liger", "cce"):  # they run every position
        assert roofline.estimate(path, half).flops == roofline.estimate(path, full).flops, path


def test_sequence_level_adds_one_gemm_and_log_probs_are_one():
    shape = dict(tokens=8192, hidden=4096, vocab=151936)
    token = roofline.estimate("gemm", Problem(**shape))
    sequence = roofline.estimate("gemm", Problem(**shape, level="sequence"))
    logprobs = roofline.estimate("gemm", Problem(**shape, operation="logprobs"))
    assert (token.gemms, sequence.gemms, logprobs.gemms) == (3, 4, 1)
    assert sequence.flops - token.flops == Problem(**shape).gemm_flops
    assert logprobs.flops == Problem(**shape).gemm_flops


def test_larger_workspace_means_fewer_waves_and_fewer_bytes():
    shape = dict(tokens=65536, hidden=1536, vocab=151936)
    small = roofline.estimate("gemm", Problem(**shape, workspace_bytes=2**29))
    large = roofline.estimate("gemm", Problem(**shape, workspace_bytes=2**31))
    assert large.hbm_bytes < small.hbm_bytes and large.peak_extra_bytes > small.peak_extra_bytes


def test_floor_at_s1_is_the_measured_44_ms():
    s1 = roofline.problem(roofline.TARGET_SHAPES["S1"], roofline.SCENARIOS["token-level"])
    # the H200 run measured 44.2 ms for the three bare GEMMs of S1 (benchmarks/results/h200.json); the model's
    # cuBLAS rate is fitted to it: 2 N H V = 10.2 TFLOP per GEMM, 14.33 ms at 711 TFLOP/s, and each output tile
    # also pays its pipeline fill, 128 elements of K: the logits and dH GEMMs (K = H = 4096) take 4224 / 4096 of
    # it, dW (K = N = 8192) 8320 / 8192
    per_gemm_ms = 2 * 8192 * 4096 * 151936 / 711e12 * 1e3
    expected = per_gemm_ms * (2 * 4224 / 4096 + 8320 / 8192)
    assert roofline.estimate("floor", s1).seconds(DEVICES["H100"]) * 1e3 == pytest.approx(expected, rel=0.005)
    assert expected == pytest.approx(44.2, rel=0.01)


def test_every_path_is_modelled_and_paths_never_beat_the_floor_without_skipping_work():
    p = roofline.problem(roofline.TARGET_SHAPES["S2"], roofline.SCENARIOS["token-level"])
    for path in MODELS:
        for key in DEVICES:
            assert roofline.x_floor(path, p, DEVICES[key]) >= 0.999, (path, key)


def test_bad_problems_are_rejected_with_the_argument_named():
    with pytest.raises(ValueError, match="valid_fraction"):
        Problem(tokens=4, hidden=2, vocab=3, valid_fraction=0.0)
    with pytest.raises(ValueError, match="dtype"):
        Problem(tokens=4, hidden=2, vocab=3, dtype="int8")
    with pytest.raises(ValueError, match="tokens"):
        Problem(tokens=0, hidden=2, vocab=3)
    with pytest.raises(ValueError, match="path"):
        roofline.estimate("magic", TINY)


def test_predictions_for_benchmark_cases():
    args = dict(operation="loss", config="dapo_kl", hidden=4096, vocab=151936, tokens=8192, dtype="bfloat16")
    h100 = roofline.predict_case_ms("NVIDIA H100 80GB HBM3", "gemm", **args)
    h200 = roofline.predict_case_ms("NVIDIA H200", "gemm", **args)
    assert h100 is not None and h200 is not None and h200 < h100
    assert roofline.predict_case_ms("Tesla V100-SXM2-16GB", "gemm", **args) is None  # no rates for it
    assert roofline.predict_case_ms("NVIDIA H100", "gemm", **{**args, "operation": "logits"}) is None
    frozen = roofline.predict_case_ms("NVIDIA H100", "gemm", **{**args, "config": "dapo_kl_frozen"})
    sequence = roofline.predict_case_ms("NVIDIA H100", "gemm", **{**args, "config": "gspo_kl"})
    assert frozen < h100 < sequence
    # GSPO on-policy is modelled as the library runs it: the token-level loss's one pass, as fast as dapo_kl's
    on_policy = roofline.predict_case_ms("NVIDIA H100", "gemm", **{**args, "config": "gspo_on_policy"})
    assert on_policy == pytest.approx(h100, rel=1e-9)
    padded = roofline.predict_case_ms("NVIDIA H100", "gemm", **args, valid_tokens=4096)
    assert padded < 0.6 * h100


def test_command_prints_the_target_shapes_and_verdicts(capsys):
    assert roofline.main(["--paths", "gemm", "floor", "--device", "H100"]) == 0
    out = capsys.readouterr().out
    assert "| S1 N=8192 H=4096 V=151936 | token-level | gemm | 3 |" in out
    assert "H100 NO (<= 1.15x)" in out and "H100 NO (<= 1.45x)" in out and "H100 NO (<= 1.1x)" in out
    assert "qwen2.5-7b" in out and "H100 SXM5 80GB" in out


def test_the_report_says_what_the_targets_are_and_which_device_each_verdict_is_for(capsys):
    assert roofline.main(["--paths", "gemm", "--section", "targets"]) == 0
    out = capsys.readouterr().out
    assert "issue" not in out.lower()  # a reader has the report, not the project's issue tracker
    assert "S1 (an 8B model's LM head): N=8192 H=4096 V=151936" in out
    assert ("time <= 1.15x the bare GEMMs of the same shape (token-level loss), <= 1.45x (sequence-level), "
            "<= 1.1x (no-grad log-probs); peak extra memory <= 1.50 GiB") in out
    assert "| S1 N=8192 H=4096 V=151936 | token-level | gemm |" in out
    # time depends on the device (a verdict per device), memory does not (one verdict)
    assert re.search(r"\| H100 (yes|NO), H200 (yes|NO) \(<= 1\.15x\) \| (yes|NO) \|", out)


def test_dw_in_the_gemm_epilogue_drops_the_temporary_and_its_traffic():
    p = roofline.problem(roofline.TARGET_SHAPES["S1"], roofline.SCENARIOS["token-level"])
    alternative, current = roofline.estimate("gemm+dw-temporary", p), roofline.estimate("gemm", p)
    waves = 5  # n_w = 2^30 // (4 * 151936) = 1767 rows: 8192 tokens in 5 waves
    assert f"{waves} waves" in current.assumptions[0]
    # (the names: `current` is the code, dW added inside the GEMM; `alternative` the float32-temporary design)
    # each later wave: GEMM3 writes 4 B per dW element either way (temporary / accumulator); the separate add
    # (temporary read 4 + accumulator read-modify-write 8) is replaced by the GEMM reading the accumulator (4)
    V, H = 151936, 4096
    assert alternative.hbm_bytes - current.hbm_bytes == (waves - 1) * V * H * (4 + 8 - 4)
    assert alternative.peak_extra_bytes - current.peak_extra_bytes == V * H * 4
    assert alternative.flops == current.flops


def test_docs_table_is_what_the_command_prints():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "benchmarks.md")) as f:
        docs = f.read()
    begin, end = docs.index("<!-- roofline:begin -->\n"), docs.index("<!-- roofline:end -->")
    expected = roofline.report(list(MODELS), list(DEVICES), 1.0, "targets")
    assert docs[begin + len("<!-- roofline:begin -->\n"):end] == expected, (
        "docs/benchmarks.md's roofline block is stale: paste `python -m benchmarks.model.roofline --section targets`")


def test_docs_auto_against_trl_block_is_what_the_command_prints():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "benchmarks.md")) as f:
        docs = f.read()
    begin, end = docs.index("<!-- auto-vs-trl:begin -->\n"), docs.index("<!-- auto-vs-trl:end -->")
    assert docs[begin + len("<!-- auto-vs-trl:begin -->\n"):end] == roofline.auto_against_trl(), (
        "docs/benchmarks.md's auto-vs-TRL block is stale: paste "
        "`python -m benchmarks.model.roofline --auto-vs-trl --device H200`")


def test_auto_against_trl_counts_a_pair_only_when_time_and_memory_are_both_lower(monkeypatch):
    """With TRL's model replaced by one that is twice auto's time and memory on every problem, every pair is ahead;
    with one that is half, none is."""
    import dataclasses

    from benchmarks.model import roofline_paths

    def scaled(factor):
        def trl(p):
            est = roofline.estimate("auto", p, roofline.DEVICES["H200"])
            phases = [dataclasses.replace(ph, flops=ph.flops * factor, hbm_bytes=ph.hbm_bytes * factor,
                                          l2_bytes=ph.l2_bytes * factor, row_read_bytes=ph.row_read_bytes * factor,
                                          l2_reduction_bytes=ph.l2_reduction_bytes * factor,
                                          launches=ph.launches * factor, host_syncs=ph.host_syncs * factor,
                                          gemm_shape=None) for ph in est.phases]
            return dataclasses.replace(est, phases=phases, peak_extra_bytes=est.peak_extra_bytes * factor + 1)
        return trl

    pairs = len(roofline.AGAINST_TRL) * 3
    monkeypatch.setitem(roofline_paths.MODELS, "trl", scaled(4))
    text = roofline.auto_against_trl()
    assert f"at {pairs} of {pairs} operation" in text and text.rstrip().endswith(f": {pairs} of {pairs}.")
    monkeypatch.setitem(roofline_paths.MODELS, "trl", scaled(0.25))
    text = roofline.auto_against_trl()
    assert f"at 0 of {pairs} operation" in text and text.rstrip().endswith(f": 0 of {pairs}.")


def test_the_backends_counted_as_pending_are_registered_and_not_yet_autos():
    from grpo_kernels.backends import get_backend

    assert roofline.PENDING_AUTO
    for name in roofline.PENDING_AUTO:
        spec = get_backend(name)
        assert not spec.auto and spec.cost is not None, name


def test_docs_kept_token_roofline_block_is_what_the_command_prints():
    """benchmarks/model/kept_tokens_cost.py --roofline (each repeated phase counted as often as it runs)."""
    from benchmarks.model.kept_tokens_cost import roofline_report, replace_count
    from grpo_kernels.cost_model import Phase

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "benchmarks.md")) as f:
        docs = f.read()
    begin, end = docs.index("<!-- kept-roofline:begin -->\n"), docs.index("<!-- kept-roofline:end -->")
    assert docs[begin + len("<!-- kept-roofline:begin -->\n"):end] == "\n".join(roofline_report()[1:]) + "\n", (
        "docs/benchmarks.md's kept-token roofline block is stale: paste "
        "`python -m benchmarks.model.kept_tokens_cost --roofline`")
    # a phase repeated keeps its kind: a cuBLAS GEMM stays at the cuBLAS rate, counted `count` times
    phase = replace_count(Phase("gemm", flops=1e12, hbm_bytes=1e9), 7)
    assert phase.count == 7 and not phase.triton_matmul and phase.flops == 1e12


def test_sequence_waves_design_makes_three_gemms_when_its_store_holds_a_sequence_and_defers_the_rest():
    from benchmarks.model.roofline_paths import sequence_waves

    N, H, V, length, scratch = 4096, 1024, 32768, 1024, 128
    one_gemm = 2 * N * H * V
    p = roofline.Problem(tokens=N, hidden=H, vocab=V, level="sequence")
    # a store of two sequences (bf16 rows) and the float32 scratch
    whole = sequence_waves(dataclasses.replace(p, workspace_bytes=2 * length * V * 2 + scratch * V * 4),
                           seq_len=length, scratch_rows=scratch)
    assert whole.flops == 3 * one_gemm and whole.gemms == 3
    assert not any(ph.name.startswith("pass 2") for ph in whole.phases)
    assert whole.peak_extra_bytes == 2 * length * V * 2 + scratch * V * 4 + N * 64
    # a store of 3/4 of a sequence: the last quarter of each is deferred to one second pass over those rows (the
    # logits again, dH and dW: a fourth GEMM over a quarter of the rows), whose dW slices add into the accumulator
    part = sequence_waves(dataclasses.replace(p, workspace_bytes=(3 * length // 4) * V * 2 + scratch * V * 4),
                          seq_len=length, scratch_rows=scratch)
    assert part.flops == 3 * one_gemm + one_gemm // 4
    deferred_dw = [ph for ph in part.phases if ph.name.startswith("GEMM3 dW_slice")]
    assert deferred_dw and all(ph.gemm_shape[1:] == (H, N // 4) for ph in deferred_dw)
    # each reads its accumulator rows as C: the operands, the float32 output, and the accumulator read
    assert sum(ph.hbm_bytes * ph.count for ph in deferred_dw) >= V * H * 4 * 2


def test_sequence_waves_design_within_trls_memory_takes_s1_and_s3_ahead_but_not_s2():
    """docs/benchmarks.md's numbers for the design (H200): 0.81x TRL's time at S1 (256-row scratch, 448 MiB),
    0.83x at S3 (512 rows, 552 MiB), each within TRL's peak; at S2 no scratch and workspace within TRL's memory
    models below TRL's time."""
    from benchmarks.model.roofline_paths import sequence_waves
    from benchmarks.suite.shapes import TARGET_SHAPES

    rates = roofline.DEVICES["H200"]

    def against_trl(shape: str, workspace_mib: int, scratch: int) -> tuple[float, bool]:
        p = roofline.problem(TARGET_SHAPES[shape], roofline.SCENARIOS["sequence-level"])
        design = sequence_waves(dataclasses.replace(p, workspace_bytes=workspace_mib * 2**20), scratch_rows=scratch)
        trl = roofline.estimate("trl", p, rates)
        return design.seconds(rates) / trl.seconds(rates), design.peak_extra_bytes < trl.peak_extra_bytes

    assert [round(t, 2) for t, _ in (against_trl("S1", 448, 256), against_trl("S3", 552, 512))] == [0.81, 0.83]
    assert against_trl("S1", 448, 256)[1] and against_trl("S3", 552, 512)[1]
    at_s2 = [against_trl("S2", mib, scratch) for scratch in (128, 256, 384, 512) for mib in range(64, 449, 16)]
    assert min(t for t, fits in at_s2 if fits) > 1.0
