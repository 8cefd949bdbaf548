"""The GEMM-rate backend: waves, the row pass (torch and Triton), gradients in the forward, and the work it skips."""

import pytest
import torch
from grpo_testing import as_float64, assert_grad_close, assert_output_matches, make_problem, run_loss

from grpo_kernels import GRPOLossConfig, LMHead, LogitTransform, fused_linear_grpo_loss, reference
from grpo_kernels.backends import gemm as gemm_path
from grpo_kernels.backends import torch_streaming as torch_chunked
from grpo_kernels.backends.gemm import GemmBackend, TORCH_ROWS, triton_rows, wave_rows
from grpo_kernels.head import IDENTITY

TOKEN_LEVEL = GRPOLossConfig(loss_type="dapo", beta=0.04, entropy_coef=0.05)
SEQUENCE_LEVEL = GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence", beta=0.04)
SOFTCAPPED = LogitTransform(scale=0.8, softcap=2.5)


def test_wave_rows_fill_the_workspace():
    assert wave_rows(1000, 4000 * 7) == 7
    assert wave_rows(1000, 10) == 1  # never fewer than one row
    with pytest.raises(ValueError, match="workspace_bytes"):
        wave_rows(1000, 0)


@pytest.mark.parametrize("transform", [IDENTITY, SOFTCAPPED], ids=["plain", "softcapped"])
@pytest.mark.parametrize("config", [TOKEN_LEVEL, SEQUENCE_LEVEL], ids=["token", "sequence"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_many_waves_match_float64_reference(config, dtype, transform):
    """A workspace of 3 rows: every wave boundary, the partial last wave and the dW accumulation across waves."""
    problem = make_problem(seed=5, B=3, T=7, H=24, V=97, dtype=dtype, importance_ratio="token")
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend="gemm", workspace_bytes=3 * 4 * 97,
                          logit_transform=transform)
    ref_out, ref_grads = run_loss(reference.fused_linear_grpo_loss, as_float64(problem), config,
                                  logit_transform=transform)
    assert_output_matches(out, grads, ref_out, ref_grads, dtype)


@pytest.mark.interpreter
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("temperature,transform", [(1.0, IDENTITY), (0.7, IDENTITY), (0.7, SOFTCAPPED)],
                         ids=["plain", "temperature", "softcapped"])
def test_triton_row_kernels_match_torch_rows(with_bias, temperature, transform):
    """The CUDA row pass (statistics, dZ in place) against the torch one, under the Triton interpreter."""
    gen = torch.Generator().manual_seed(3)
    N, H, V = 9, 16, 301
    hidden = torch.randn(N, H, generator=gen)
    weight = torch.randn(V, H, generator=gen) * 0.6
    bias = torch.randn(V, generator=gen) if with_bias else None
    targets = torch.randint(0, V, (N,), generator=gen)
    targets[2] = -1  # a foreign id (vocabulary shard): no target logit, no one-hot
    g, e = torch.randn(N, generator=gen), torch.randn(N, generator=gen)
    results = []
    for rows in (TORCH_ROWS, triton_rows()):
        backend = GemmBackend(workspace_bytes=4 * 4 * V, rows=rows)
        head = LMHead(weight, bias, temperature, transform)
        stats = backend.linear_forward(hidden, head, targets)
        grads = backend.linear_backward(g, e, hidden, head, targets, stats[2], stats[1])
        results.append((*stats, *grads))
    for torch_rows, triton in zip(*results):
        torch.testing.assert_close(triton, torch_rows, rtol=2e-5, atol=2e-5)
    lse = results[0][2]
    assert float(results[0][0][2]) == pytest.approx(-float(lse[2]), abs=1e-6)


@pytest.mark.interpreter
@pytest.mark.parametrize("transform", [IDENTITY, SOFTCAPPED], ids=["plain", "softcapped"])
def test_segmented_row_statistics_match_float64(transform):
    """The statistics pass over row segments (more programs a launch) against float64 whole-row statistics:
    a peaked and a flat row, targets in every segment, at a segment edge, foreign (-1, >= V)."""
    from grpo_kernels.cost_model.paths import row_segments

    gen = torch.Generator().manual_seed(11)
    R, V = 6, 1024
    z = torch.randn(R, V, generator=gen) * 3
    z[0, 700] = 40.0  # one token takes nearly all the mass, in the sixth segment
    z[1] = 0.01 * z[1]  # nearly flat
    targets = torch.tensor([700, 5, 128, 1023, -1, V + 3])
    stats = triton_rows(min_segment=128).stats
    assert row_segments(V, min_segment=128) == 8
    inv_tau, cap = LMHead(torch.zeros(V, 4), None, 0.8, transform).logit_constants
    lse, entropy, target_z = stats(z.clone(), None, targets, inv_tau, cap)
    logits = z.double()
    logits = torch.tanh(logits * cap) * inv_tau if cap is not None else logits * inv_tau
    ref_lse = torch.logsumexp(logits, 1)
    log_p = logits - ref_lse[:, None]
    ref_entropy = -(log_p.exp() * log_p).sum(1)
    inside = (targets >= 0) & (targets < V)
    ref_target = torch.where(inside, logits.gather(1, targets.clamp(0, V - 1)[:, None]).squeeze(1), 0.0)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=2e-5)
    torch.testing.assert_close(entropy.double(), ref_entropy, rtol=0, atol=2e-5)
    torch.testing.assert_close(target_z.double(), ref_target, rtol=0, atol=2e-5)
    # with a bias, one segment (the kernel indexes the bias by the column): the whole-row kernel's answer
    assert row_segments(V, has_bias=True, min_segment=128) == 1


@pytest.mark.interpreter
@pytest.mark.parametrize("config", [TOKEN_LEVEL, SEQUENCE_LEVEL], ids=["token", "sequence"])
def test_segmented_statistics_loss_matches_float64(monkeypatch, config):
    """The loss and its gradients (hidden, weight) through the GEMM path with segmented Triton statistics."""
    import functools

    merged = []
    merge = gemm_path.merge_segment_stats
    monkeypatch.setattr(gemm_path, "merge_segment_stats", lambda *stats: merged.append(1) or merge(*stats))
    monkeypatch.setattr(gemm_path, "GemmBackend", functools.partial(GemmBackend, rows=triton_rows(min_segment=64)))
    problem = make_problem(seed=8, B=2, T=5, H=16, V=512, dtype=torch.float32, importance_ratio="token",
                           with_bias=False)
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend="gemm", workspace_bytes=4 * 4 * 512)
    ref_out, ref_grads = run_loss(reference.fused_linear_grpo_loss, as_float64(problem), config)
    assert_output_matches(out, grads, ref_out, ref_grads, torch.float32)
    # 8 segments a row; the one-pass route merges each wave's (4 rows a wave), a statistics-only pass once
    assert len(merged) == (2 if config is TOKEN_LEVEL else 1)


@pytest.mark.interpreter
def test_segment_targets_are_formed_once_a_call(monkeypatch):
    """Every row's targets per segment are formed once, before the waves, and each wave takes its rows of them:
    the same statistics as a wave that forms its own."""
    formed = []
    by_segment = gemm_path.targets_by_segment
    monkeypatch.setattr(gemm_path, "targets_by_segment", lambda *args: formed.append(args[0].shape) or
                        by_segment(*args))
    gen = torch.Generator().manual_seed(12)
    N, H, V = 11, 16, 512
    hidden, weight = torch.randn(N, H, generator=gen), torch.randn(V, H, generator=gen)
    targets = torch.randint(0, V, (N,), generator=gen)
    rows = triton_rows(min_segment=64)
    head = LMHead(weight, None, 1.0, IDENTITY)
    waves = GemmBackend(workspace_bytes=3 * 4 * V, rows=rows).linear_forward(hidden, head, targets)
    assert formed == [(N,)]  # four waves of up to 3 rows, one formation
    whole = GemmBackend(workspace_bytes=N * 4 * V, rows=TORCH_ROWS).linear_forward(hidden.double(), LMHead(
        weight.double(), None, 1.0, IDENTITY), targets)
    for got, want in zip(waves, whole):
        torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)


@pytest.mark.interpreter
def test_triton_row_grad_narrows_to_bf16_in_place():
    """dZ written as bf16 over the float32 logits it reads, row by row, equals dZ computed out of place."""
    from grpo_kernels.kernels import rows

    triton_rows()  # selects the interpreter on CPU
    gen = torch.Generator().manual_seed(4)
    R, V = 5, 700
    z = torch.randn(R, V, generator=gen) * 3
    targets = torch.randint(0, V, (R,), generator=gen)
    lse, ent, _ = rows.row_stats(z, None, targets, 1.0)
    g, e = torch.randn(R, generator=gen), torch.randn(R, generator=gen)
    expected = rows.row_grad_(z.clone(), None, targets, lse, ent, g, e, 1.0, None, torch.float32)
    storage = z.clone()
    narrowed = rows.row_grad_(storage, None, targets, lse, ent, g, e, 1.0, None, torch.bfloat16)
    assert narrowed.dtype == torch.bfloat16 and narrowed.data_ptr() == storage.data_ptr()
    assert narrowed.stride() == (2 * V, 1)
    torch.testing.assert_close(narrowed.float(), expected, rtol=1e-2, atol=1e-2 * float(expected.abs().max()))


@pytest.mark.interpreter
@pytest.mark.parametrize("narrow", [torch.bfloat16, torch.float16])
def test_triton_row_grad_into_another_buffer(narrow):
    """With `out`, dZ goes into a separate 16-bit buffer (strided rows of a wider store: the sequence route's) equal
    bit for bit to the in-place narrowing, and the float32 logits are left as they were."""
    from grpo_kernels.kernels import rows

    triton_rows()  # selects the interpreter on CPU
    gen = torch.Generator().manual_seed(5)
    R, V = 4, 600
    z = torch.randn(R, V, generator=gen) * 3
    bias = torch.randn(V, generator=gen)
    targets = torch.randint(0, V, (R,), generator=gen)
    lse, ent, _ = rows.row_stats(z, bias, targets, 0.7, 0.1)
    g, e = torch.randn(R, generator=gen), torch.randn(R, generator=gen)
    in_place = rows.row_grad_(z.clone(), bias, targets, lse, ent, g, e, 0.7, 0.1, narrow)
    store = torch.full((R, V + 3), 7.0, dtype=narrow)
    kept = z.clone()
    got = rows.row_grad_(z, bias, targets, lse, ent, g, e, 0.7, 0.1, narrow, out=store[:, 1:V + 1])
    assert got.data_ptr() == store[:, 1:].data_ptr()
    assert torch.equal(z, kept)
    assert torch.equal(got, in_place)
    assert torch.all(store[:, 0] == 7.0) and torch.all(store[:, V + 1:] == 7.0)  # nothing outside its columns


class _CallCounter:
    def __init__(self, monkeypatch, module, name):
        self.calls = 0
        original = getattr(module, name)

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)


@pytest.mark.parametrize("config", [TOKEN_LEVEL, SEQUENCE_LEVEL], ids=["token", "sequence"])
def test_frozen_head_does_no_weight_gradient_work(monkeypatch, config):
    problem = make_problem(seed=1, B=2, T=5, H=12, V=50)
    accumulator = _CallCounter(monkeypatch, gemm_path.WeightGrad, "add")
    hidden = problem.hidden.clone().requires_grad_()
    out = fused_linear_grpo_loss(hidden, problem.weight, problem.completion_ids, problem.completion_mask,
                                 problem.advantages, old_logps=problem.old_logps, ref_logps=problem.ref_logps,
                                 config=config, backend="gemm", workspace_bytes=4 * 4 * 50)
    out.loss.backward()
    assert accumulator.calls == 0, "dW was computed for a frozen head"
    assert hidden.grad is not None and hidden.grad.abs().sum() > 0
    # the same problem with a trainable head does accumulate (the counter can fail)
    out = fused_linear_grpo_loss(hidden, problem.weight.clone().requires_grad_(), problem.completion_ids,
                                 problem.completion_mask, problem.advantages, old_logps=problem.old_logps,
                                 ref_logps=problem.ref_logps, config=config, backend="gemm")
    out.loss.backward()
    assert accumulator.calls > 0


@pytest.mark.parametrize("backend", ["gemm", "torch"])
def test_no_grad_does_no_gradient_work(monkeypatch, backend):
    problem = make_problem(seed=2, B=2, T=4, H=8, V=40)
    softmax_grads = _CallCounter(monkeypatch, gemm_path, "softmax_grad_")
    chunked_grads = _CallCounter(monkeypatch, torch_chunked, "softmax_grad_")
    with torch.no_grad():
        out = fused_linear_grpo_loss(problem.hidden.requires_grad_(), problem.weight.requires_grad_(),
                                     problem.completion_ids, problem.completion_mask, problem.advantages,
                                     old_logps=problem.old_logps, ref_logps=problem.ref_logps, config=TOKEN_LEVEL,
                                     backend=backend)
    assert softmax_grads.calls == 0 and chunked_grads.calls == 0
    assert torch.isfinite(out.loss) and not out.loss.requires_grad
    out = fused_linear_grpo_loss(problem.hidden, problem.weight, problem.completion_ids, problem.completion_mask,
                                 problem.advantages, old_logps=problem.old_logps, ref_logps=problem.ref_logps,
                                 config=TOKEN_LEVEL, backend=backend)
    out.loss.backward()  # with gradients on, the counters do move
    assert softmax_grads.calls + chunked_grads.calls > 0


def test_gradient_in_forward_matches_two_pass_route():
    """The one-pass token-level route (3 GEMMs) and the generic route (statistics, autograd objective, backward
    from g and e: 4 GEMMs) give the same loss and gradients."""
    problem = make_problem(seed=8, B=3, T=6, H=20, V=77, importance_ratio="token")
    out, grads = run_loss(fused_linear_grpo_loss, problem, TOKEN_LEVEL, backend="gemm")
    from grpo_kernels import objective

    with pytest.MonkeyPatch.context() as monkey:  # force the generic route on the same backend
        monkey.setattr(objective, "is_token_level", lambda config: False)
        out2, grads2 = run_loss(fused_linear_grpo_loss, problem, TOKEN_LEVEL, backend="gemm")
    torch.testing.assert_close(out.loss, out2.loss, rtol=1e-6, atol=1e-7)
    for name in grads:
        torch.testing.assert_close(grads[name], grads2[name], rtol=1e-5, atol=1e-6)


def test_backward_scales_the_precomputed_gradients():
    problem = make_problem(seed=9, B=2, T=5, H=10, V=30)
    leaves = [problem.hidden.clone().requires_grad_(), problem.weight.clone().requires_grad_()]
    for scale in (1.0, -2.5):
        for leaf in leaves:
            leaf.grad = None
        out = fused_linear_grpo_loss(*leaves, problem.completion_ids, problem.completion_mask, problem.advantages,
                                     old_logps=problem.old_logps, ref_logps=problem.ref_logps, config=TOKEN_LEVEL,
                                     backend="gemm")
        (scale * out.loss).backward()
        if scale == 1.0:
            base = [leaf.grad.clone() for leaf in leaves]
        else:
            for leaf, expected in zip(leaves, base):
                torch.testing.assert_close(leaf.grad, scale * expected)


def test_bitwise_reproducible():
    problem = make_problem(seed=10, B=3, T=6, H=16, V=64)
    runs = [run_loss(fused_linear_grpo_loss, problem, TOKEN_LEVEL, backend="gemm", workspace_bytes=4 * 4 * 64)
            for _ in range(2)]
    assert torch.equal(runs[0][0].loss, runs[1][0].loss)
    for name in runs[0][1]:
        assert torch.equal(runs[0][1][name], runs[1][1][name])


def test_workspace_bytes_validated():
    problem = make_problem(seed=0)
    with pytest.raises(ValueError, match="workspace_bytes"):
        fused_linear_grpo_loss(problem.hidden, problem.weight, problem.completion_ids, problem.completion_mask,
                               problem.advantages, backend="gemm", workspace_bytes=-1)


def test_gradients_are_not_copied_in_the_backward(monkeypatch):
    """The backward scales the precomputed gradients in place and autograd takes them over as .grad: no second
    [V, H] copy. A graph kept for another backward (retain_graph=True) scales a copy instead, so that the second
    backward finds them unchanged (tests/grpo_kernels/test_hostile_inputs.py checks what it then gives)."""
    from grpo_kernels import ops

    computed = []
    real = ops.one_pass_token_level

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        computed.append(out[6].data_ptr())  # dweight
        return out

    monkeypatch.setattr(ops, "one_pass_token_level", recording)
    problem = make_problem(seed=11, B=2, T=4, H=8, V=20)
    for retain, shared in ((False, True), (True, False)):
        weight = problem.weight.clone().requires_grad_()
        out = fused_linear_grpo_loss(problem.hidden, weight, problem.completion_ids, problem.completion_mask,
                                     problem.advantages, old_logps=problem.old_logps, ref_logps=problem.ref_logps,
                                     config=TOKEN_LEVEL, backend="gemm")
        out.loss.backward(retain_graph=retain)
        assert (weight.grad.data_ptr() == computed[-1]) is shared


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_accumulate_gemm_adds_a_16_bit_product_into_float32(dtype):
    """The 16-bit dW update across waves (CUDA): C += A^T B inside the GEMM, A with a row stride of 2M as the
    narrowed dZ has; under the Triton interpreter here."""
    from grpo_kernels.kernels.accumulate_mm import accumulate_at_b

    triton_rows()  # selects the interpreter on CPU
    gen = torch.Generator().manual_seed(12)
    K, M, N = 37, 70, 45
    storage = torch.randn(K, 2 * M, generator=gen).to(dtype)
    a = storage[:, :M]
    b = torch.randn(K, N, generator=gen).to(dtype)
    c = torch.randn(M, N, generator=gen)
    expected = c + a.float().T @ b.float()
    out = accumulate_at_b(c, a, b)
    assert out.data_ptr() == c.data_ptr()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="float32"):
        accumulate_at_b(c.to(dtype), a, b)


def test_gradient_tiles_slice_the_vocabulary_where_it_saves_accumulator_passes():
    from grpo_kernels.cost_model.paths import balanced, gradient_tiles

    # 11 tokens, V 97, H 4, a workspace of 5 rows x (16 logits + 4 dH sums) float32: whole rows would take 11
    # waves (10 more passes over dW), slices of 16 columns 3 waves (2 more over dW, 6 over each wave's dH sums);
    # balanced: 3 waves of 4 rows (the last 3), 7 slices of 14 columns (the last 13)
    assert gradient_tiles(11, 97, 4, 4 * 5 * 20, min_slice=16) == (4, 14)
    # a frozen head has no dW to pass over again: whole rows, whatever the waves
    assert gradient_tiles(11, 97, 4, 4 * 5 * 20, weight_grad=False, min_slice=16) == (1, 97)
    # a workspace that holds every row whole: one wave, no slices
    assert gradient_tiles(11, 97, 4, 4 * 11 * 97, min_slice=16) == (11, 97)
    # only dW needed: slices cost nothing (no dH sums either), one wave of every token
    assert gradient_tiles(11, 97, 4, 4 * 11 * 16, hidden_grad=False, min_slice=16) == (11, 14)
    # at scale, whole GEMM tiles: 65536 tokens of H 1536 in a 297 MiB workspace take 9 waves of 7296 rows (57
    # tiles of 128), slices of 8192 columns (32 tiles of 256)
    assert gradient_tiles(65536, 151936, 1536, 297 << 20) == (7296, 8192)
    assert balanced(1000, 300, 128) == 256 and balanced(1000, 255, 128) == 250 and balanced(1000, 400, 128) == 384
    with pytest.raises(ValueError, match="workspace_bytes"):
        gradient_tiles(11, 97, 4, 0)


def _float64_gradients(hidden, head, targets, g, e):
    """dH, dW, dbias of sum(g * logp + e * entropy) by autograd in float64 over the whole logits; a foreign target
    (a vocabulary shard's) has no target logit: its logp is -lse, as the backends take it."""
    h = hidden.double().requires_grad_()
    w = head.weight.double().requires_grad_()
    b = None if head.bias is None else head.bias.double().requires_grad_()
    logits = reference.linear_logits(h, w, b)
    scaled = head.transform.apply(logits) / head.temperature
    log_p = torch.log_softmax(scaled, dim=-1)
    inside = (targets >= 0) & (targets < scaled.shape[1])
    target_z = torch.where(inside, scaled.gather(1, targets.clamp(0, scaled.shape[1] - 1)[:, None]).squeeze(1), 0.0)
    logps = target_z - torch.logsumexp(scaled, dim=-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    (g.double() * logps + e.double() * entropy).sum().backward()
    return h.grad, w.grad, None if b is None else b.grad


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("transform", [IDENTITY, SOFTCAPPED], ids=["plain", "softcapped"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("workspace_rows,waves", [(5, 3), (11, 1)], ids=["three-waves", "one-wave"])
def test_gradient_pass_in_vocabulary_slices_matches_float64(workspace_rows, waves, dtype, transform, with_bias):
    """The second pass from given statistics, in vocabulary slices of 14 columns (the last one 13 wide), against
    float64 autograd: dH summed over slices, dW's slices over waves, dbias per slice, targets in every slice and
    a foreign one (-1)."""
    from grpo_kernels.cost_model.paths import gradient_tiles

    gen = torch.Generator().manual_seed(21)
    N, H, V = 11, 12, 97
    hidden = torch.randn(N, H, generator=gen).to(dtype)
    head = LMHead((torch.randn(V, H, generator=gen) * 0.5).to(dtype),
                  (torch.randn(V, generator=gen) * 0.5).to(dtype) if with_bias else None, 0.9, transform)
    targets = torch.tensor([0, 15, 16, 31, 32, 50, 80, 95, 96, 7, -1])
    g, e = torch.randn(N, generator=gen), torch.randn(N, generator=gen)
    workspace = 4 * workspace_rows * (16 + H)
    rows, columns = gradient_tiles(N, V, H, workspace, min_slice=16)
    assert columns < V and -(-N // rows) == waves  # the case under test slices the vocabulary
    backend = GemmBackend(workspace_bytes=workspace, min_gradient_slice=16)
    _, entropy, lse = backend.linear_forward(hidden, head, targets)
    got = backend.linear_backward(g, e, hidden, head, targets, lse, entropy)
    expected = _float64_gradients(hidden, head, targets, g, e)
    for name, value, want in zip(("dH", "dW", "dbias"), got, expected):
        if want is None:
            assert value is None, name
        else:
            assert_grad_close(value, want, dtype, name)


@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")  # masked lanes: -inf - -inf
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_gradient_pass_in_slices_on_the_cuda_data_flow(with_bias):
    """The same sliced pass with CUDA's data flow (16-bit GEMM operands, dZ narrowed in place by the Triton row
    kernel, float32 accumulators read as C) against the whole-row pass on the same flow: equal up to the order of
    float32 sums."""
    gen = torch.Generator().manual_seed(22)
    N, H, V = 9, 16, 70
    hidden = torch.randn(N, H, generator=gen).to(torch.bfloat16)
    head = LMHead((torch.randn(V, H, generator=gen) * 0.5).to(torch.bfloat16),
                  torch.randn(V, generator=gen).to(torch.bfloat16) if with_bias else None, 1.0, SOFTCAPPED)
    targets = torch.tensor([0, 15, 16, 40, 69, 3, -1, 33, 64])
    g, e = torch.randn(N, generator=gen), torch.randn(N, generator=gen)
    results = []
    for workspace, min_slice in ((4 * 3 * (16 + H), 16), (4 * N * V, 4096)):  # slices of 16; whole rows, one wave
        backend = GemmBackend(workspace_bytes=workspace, rows=triton_rows(gpu_launch=True),
                              gemm_in_input_dtype=True, min_gradient_slice=min_slice)
        _, entropy, lse = backend.linear_forward(hidden, head, targets)
        results.append(backend.linear_backward(g, e, hidden, head, targets, lse, entropy))
    assert (results[0][2] is None) is (not with_bias)
    for sliced, whole in zip(*results):
        if whole is not None:
            torch.testing.assert_close(sliced.float(), whole.float(), rtol=1e-2, atol=1e-3)
