"""The Hopper-recipe backend (backends/triton_tma.py: the persistent TMA forward storing each chunk's logits,
kernels/chunk_grad.py's dz in place, dH and dW by GEMM; or its statistics first and the GEMM path's gradient pass
in vocabulary slices) under the interpreter, against float64: the Protocol's backward and the ONE_PASS route by
either way, trained and frozen heads, bias or none, soft-capped heads, targets
outside the shard, several chunks with a partial last one (tail tiles in both dimensions: N 45, V 300 over the
interpreter's 16 x 32 tiles), float32 / bfloat16 / float16 inputs; a vocabulary shard through the route's
combine_stats hook; every built-in loss type and a registered one through the public API; kept-token sets; bitwise
repeatability and statistics independent of the chunking."""

import pytest
import torch
from grpo_testing import as_float64, assert_grad_close, assert_output_matches, kept_sets, make_problem, run_loss
from linear_head_cases import (SOFTCAPPED, assert_grad, backward_args, float64_grads, float64_stats, forward_args,
                               inputs)

import grpo_kernels
from grpo_kernels import GRPOLossConfig, LogitTransform, fused_linear_grpo_loss, linear_logprobs, reference
from grpo_kernels.backends import get_backend
from grpo_kernels.backends.triton_tma import TmaChunkBackend, chunk_rows
from grpo_kernels.head import IDENTITY
from grpo_kernels.kernels.configs import INTERPRETER_CONFIGS, stored_rows_within
from grpo_kernels.losses import loss_type_names, unregister_loss_type

pytestmark = pytest.mark.interpreter
# 16 rows a chunk at V 300 (the interpreter's 16-token blocks): N 45 runs chunks of 16, 16 and 13 rows
SMALL_WORKSPACE = 16 * 4 * 300
TRANSFORMS = pytest.mark.parametrize("transform", [IDENTITY, SOFTCAPPED], ids=["plain", "softcapped"])


def test_chunks_are_whole_token_blocks_counted_from_the_gemm_paths_waves():
    config = INTERPRETER_CONFIGS["persistent"]
    block, tile = config.block_n, config.block_v
    # float32: 16 float32 rows of 300 hold 15 rows of exponentials and maxima (one float32 per 32 columns)
    assert chunk_rows(300, SMALL_WORKSPACE, block, 4, tile) == 16  # at least one block
    assert chunk_rows(300, SMALL_WORKSPACE - 1, block, 4, tile) == 16
    assert chunk_rows(300, 40 * 4 * 300, block, 4, tile) == 32
    # 16-bit: twice the rows but for the maxima (40 float32 rows: 75 rows of 2 + 4 / 32 bytes a logit)
    assert chunk_rows(300, 40 * 4 * 300, block, 2, tile) == 64
    # a shard's ranks (vocab_parallel.VocabShard.wave_workspace) get equal chunks whatever their vocabulary
    for itemsize in (2, 4):
        assert chunk_rows(150, 40 * 4 * 150, block, itemsize, tile) == chunk_rows(151, 40 * 4 * 151, block,
                                                                                  itemsize, tile)
    # on the GPU (bf16: 128-token blocks, 128-column tiles): whole blocks from two blocks on, multiples of 32 rows
    # below, at least one block; 2 + 4 / 128 bytes a logit, so about twice a float32 row's count
    # (128 float32 rows: 252 rows, 224 tokens a chunk, the maxima taking the rest)
    assert [chunk_rows(151936, rows * 4 * 151936 + 5, 128, 2, 128) for rows in (50, 100, 112, 128, 150, 540)] == \
        [128, 192, 192, 224, 256, 1024]
    # the exponentials and maxima of a chunk stay within the workspace but for a few bytes a row
    for rows in (50, 100, 128, 540):
        workspace = rows * 4 * 151936
        n = stored_rows_within(rows, 2, 128)
        assert n * (2 * 151936 + 4 * (-(-151936 // 128))) <= workspace + n * 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_chunk_is_exponentials_in_the_input_dtype_within_the_workspace(dtype, monkeypatch):
    """What the forward is given to store: a chunk in the input dtype (a 16-bit one twice a float32 one's rows in
    the same workspace) with one float32 maximum per row and vocabulary tile, rows 16-byte aligned, the chunk and
    its maxima within the workspace but for a few bytes a row."""
    from grpo_kernels.kernels import launch

    stored = []
    original = launch.persistent_forward

    def recording(hidden, head, targets, chunk=None, tile_max=None):
        stored.append((chunk, tile_max))
        return original(hidden, head, targets, chunk=chunk, tile_max=tile_max)

    monkeypatch.setattr(launch, "persistent_forward", recording)
    (hidden, weight, bias), targets, g, e = inputs(seed=9, dtype=dtype)
    TmaChunkBackend(SMALL_WORKSPACE * 2, chunks=True).linear_forward_with_grads(
        *forward_args(hidden, weight, bias, targets), _token_grads(g, e, []))
    rows = {torch.float32: 16, torch.bfloat16: 48, torch.float16: 48}[dtype]  # 32 float32 rows' bytes
    assert [c.shape[0] for c, _ in stored] == [rows] * (45 // rows) + ([45 % rows] if 45 % rows else [])
    tiles = -(-300 // INTERPRETER_CONFIGS["persistent"].block_v)
    for chunk, tile_max in stored:
        assert chunk.dtype == dtype and chunk.shape[1] == 300 and tile_max.dtype == torch.float32
        assert tile_max.shape == (chunk.shape[0], tiles)
        assert (chunk.stride(0) * chunk.element_size()) % 16 == 0 and chunk.data_ptr() % 16 == 0
    chunk, tile_max = stored[0]
    held = chunk.untyped_storage().nbytes() + tile_max.untyped_storage().nbytes()
    assert held <= SMALL_WORKSPACE * 2 + 16 * rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunks_that_end_inside_a_token_block_give_float64s_answer(dtype):
    """Chunks of 24 rows with 16-row blocks (align 8, fewer than two blocks): each chunk's second block half filled,
    its rows past the chunk masked; the statistics and gradients as float64's."""
    (hidden, weight, bias), targets, g, e = inputs(seed=6, dtype=dtype, out_of_shard=4)
    calls = []
    # 24 rows of exponentials and maxima: in 25 float32 rows' bytes (float32), 13 (bfloat16)
    float32_rows = {torch.float32: 25, torch.bfloat16: 13}[dtype]
    backend = TmaChunkBackend(float32_rows * 4 * 300, chunks=True, min_gradient_slice=32, chunk_row_align=8)
    logps, entropy, lse, dh, dw, db = backend.linear_forward_with_grads(
        *forward_args(hidden, weight, bias, targets, SOFTCAPPED), _token_grads(g, e, calls))
    assert calls == [(0, 24), (24, 45)]
    for name, actual, ref in zip(("logps", "entropy", "lse"), (logps, entropy, lse),
                                 float64_stats(hidden, weight, bias, targets, SOFTCAPPED)):
        torch.testing.assert_close(actual.double(), ref, atol=1e-4, rtol=1e-4, msg=name)
    for name, actual, ref in zip(("dhidden", "dweight", "dbias"), (dh, dw, db),
                                 float64_grads(hidden, weight, bias, targets, g, e, SOFTCAPPED)):
        assert_grad(actual, ref, dtype, name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_peaked_rows_whose_target_holds_nearly_all_the_mass_keep_their_digits(dtype):
    """Logits up to ~|60| with half the targets the row's argmax (p within 1e-6 of 1, where 1 - p computed from a
    16-bit p would have no digit left): the argmax is its tile's running maximum, stored as exactly 1, so p is
    exp(m - lse) in float32 (chunk_grad.py); every gradient within the dtype's tolerance of float64."""
    (hidden, weight, bias), targets, g, e = inputs(seed=8, dtype=dtype)
    weight = (weight.double() * 4).to(dtype)
    z = (hidden.double() @ weight.double().T + bias.double()) / 0.7
    targets[::2] = z.argmax(1)[::2]
    assert z.abs().max() > 40 and torch.softmax(z, 1).amax(1).max() > 1 - 1e-6
    logps, entropy, lse, dh, dw, db = TmaChunkBackend(SMALL_WORKSPACE, chunks=True).linear_forward_with_grads(
        *forward_args(hidden, weight, bias, targets), _token_grads(g, e, []))
    for name, actual, ref in zip(("dhidden", "dweight", "dbias"), (dh, dw, db),
                                 float64_grads(hidden, weight, bias, targets, g, e)):
        assert_grad(actual, ref, dtype, name)


@TRANSFORMS
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_backward_matches_float64(dtype, with_bias, transform):
    (hidden, weight, bias), targets, g, e = inputs(seed=2, dtype=dtype, with_bias=with_bias, out_of_shard=6)
    expected = float64_grads(hidden, weight, bias, targets, g, e, transform)
    _, _, lse, _ = float64_stats(hidden, weight, bias, targets, transform)
    stats = [s.float() for s in float64_stats(hidden, weight, bias, targets, transform)[:3]]
    backend = TmaChunkBackend(SMALL_WORKSPACE, min_gradient_slice=32)  # slices of 32 columns (the last 12)
    dh, dw, db = backend.linear_backward(*backward_args(g, e, hidden, weight, bias, targets, stats[2], stats[1],
                                                        transform))
    assert dh.dtype == dw.dtype == dtype
    assert_grad(dh, expected[0], dtype, "dhidden")
    assert_grad(dw, expected[1], dtype, "dweight")
    if with_bias:
        assert_grad(db, expected[2], dtype, "dbias")
    else:
        assert db is None


@pytest.mark.parametrize("needs", [(True, False), (False, True)], ids=["frozen_head", "weight_only"])
def test_one_gradient_alone(needs):
    (hidden, weight, bias), targets, g, e = inputs(seed=3, dtype=torch.bfloat16, out_of_shard=2)
    expected = float64_grads(hidden, weight, bias, targets, g, e, SOFTCAPPED)
    _, entropy, lse, _ = float64_stats(hidden, weight, bias, targets, SOFTCAPPED)
    dh, dw, db = TmaChunkBackend(SMALL_WORKSPACE).linear_backward(
        *backward_args(g, e, hidden, weight, bias, targets, lse, entropy, SOFTCAPPED), *needs)
    assert (dh is None) != needs[0] and (dw is None) != needs[1] and (db is None) != needs[1]
    if needs[0]:
        assert_grad(dh, expected[0], torch.bfloat16, "dhidden")
    else:
        assert_grad(dw, expected[1], torch.bfloat16, "dweight")
        assert_grad(db, expected[2], torch.bfloat16, "dbias")


def _token_grads(g, e, calls):
    def token_grads(n0, n1, logps, entropy):
        calls.append((n0, n1))
        return g[n0:n1].float(), e[n0:n1].float()
    return token_grads


@pytest.mark.parametrize("chunks,calls_made", [(True, [(0, 16), (16, 32), (32, 45)]), (False, [(0, 45)])],
                         ids=["token-chunks", "two-passes"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_pass_route_gives_statistics_and_gradients_of_float64(dtype, chunks, calls_made):
    """The ONE_PASS route through the token chunks (g and e of each chunk's rows as it comes) or in two passes
    (every token's statistics, then g and e of all, then the gradient pass in slices of 32 columns)."""
    (hidden, weight, bias), targets, g, e = inputs(seed=4, dtype=dtype, out_of_shard=4)
    calls = []
    logps, entropy, lse, dh, dw, db = TmaChunkBackend(SMALL_WORKSPACE, chunks=chunks, min_gradient_slice=32
                                                      ).linear_forward_with_grads(
        *forward_args(hidden, weight, bias, targets, SOFTCAPPED), _token_grads(g, e, calls))
    assert calls == calls_made
    tol = 1e-4
    for name, actual, ref in zip(("logps", "entropy", "lse"), (logps, entropy, lse),
                                 float64_stats(hidden, weight, bias, targets, SOFTCAPPED)):
        torch.testing.assert_close(actual.double(), ref, atol=tol, rtol=tol, msg=name)
    for name, actual, ref in zip(("dhidden", "dweight", "dbias"), (dh, dw, db),
                                 float64_grads(hidden, weight, bias, targets, g, e, SOFTCAPPED)):
        assert_grad(actual, ref, dtype, name)


def test_a_vocabulary_shard_combines_statistics_per_chunk():
    """Two shards of one head, each through the ONE_PASS route with combine_stats standing in for the collective
    (it checks the shard's local statistics and hands back the whole vocabulary's): each shard's dW and dbias are
    its rows of the whole head's, and the shards' dH sum to the whole dH."""
    (hidden, weight, bias), targets, g, e = inputs(seed=6, N=40, V=130)
    whole = float64_grads(hidden, weight, bias, targets, g, e, SOFTCAPPED)
    logps64, entropy64, lse64, _ = float64_stats(hidden, weight, bias, targets, SOFTCAPPED)
    dh_sum = torch.zeros_like(whole[0])
    for v0, v1 in ((0, 61), (61, 130)):
        local_targets = torch.where((targets >= v0) & (targets < v1), targets - v0, -1)
        local = float64_stats(hidden, weight[v0:v1], bias[v0:v1], local_targets, SOFTCAPPED)
        done = []

        def combine(lse, entropy, target_z):
            n0 = sum(done)
            n1 = n0 + lse.shape[0]
            done.append(lse.shape[0])
            torch.testing.assert_close(lse.double(), local[2][n0:n1], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(entropy.double(), local[1][n0:n1], atol=1e-5, rtol=1e-5)
            return (lse64[n0:n1].float(), entropy64[n0:n1].float(), (logps64 + lse64)[n0:n1].float())

        # the workspace vocab_parallel.VocabShard.wave_workspace gives this rank: 16 rows a chunk on both
        logps, _, _, dh, dw, db = TmaChunkBackend(16 * 4 * (v1 - v0)).linear_forward_with_grads(
            *forward_args(hidden, weight[v0:v1], bias[v0:v1], local_targets, SOFTCAPPED), _token_grads(g, e, []),
            combine_stats=combine)
        assert done == [16, 16, 8]
        torch.testing.assert_close(logps.double(), logps64, atol=1e-5, rtol=1e-5)
        assert_grad(dw, whole[1][v0:v1], torch.float32, f"dweight [{v0}, {v1})")
        assert_grad(db, whole[2][v0:v1], torch.float32, f"dbias [{v0}, {v1})")
        dh_sum += dh.double()
    assert_grad(dh_sum, whole[0], torch.float32, "dhidden summed over the shards")


def test_bitwise_repeatable_and_chunking_leaves_the_statistics_alone():
    (hidden, weight, bias), targets, g, e = inputs(seed=7, dtype=torch.bfloat16)
    args = forward_args(hidden, weight, bias, targets, SOFTCAPPED)
    runs = [TmaChunkBackend(workspace, chunks=chunks).linear_forward_with_grads(*args, _token_grads(g, e, []))
            for workspace, chunks in ((SMALL_WORKSPACE, True), (SMALL_WORKSPACE, True), (1 << 20, True),
                                      (SMALL_WORKSPACE, False), (SMALL_WORKSPACE, False))]
    for first, second in ((0, 1), (3, 4)):  # each route bitwise repeatable
        for a, b in zip(runs[first], runs[second]):
            assert torch.equal(a, b)
    for other in (2, 3):  # one chunk, three, or every token at once: bitwise the same statistics
        for a, b in zip(runs[0][:3], runs[other][:3]):
            assert torch.equal(a, b)
    alone = TmaChunkBackend(1 << 20).linear_forward(*args)
    for a, b in zip(runs[0][:3], alone):
        assert torch.equal(a, b)


def _loss_vs_float64(config: GRPOLossConfig, dtype=torch.float32, seed=21):
    problem = make_problem(seed=seed, B=3, T=6, H=16, V=40, dtype=dtype, logit_scale=2.0)
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend="triton_tma")
    ref_out, ref_grads = run_loss(fused_linear_grpo_loss, as_float64(problem), config, backend="reference")
    assert_output_matches(out, grads, ref_out, ref_grads, dtype)


@pytest.mark.parametrize("loss_type", loss_type_names())
def test_every_built_in_loss_type_matches_float64(loss_type):
    # grpo as GSPO (a sequence-level objective: the two-step route, the backward recomputing each chunk); luspo as
    # its paper has it
    sequence = dict(importance_sampling_level="sequence") if loss_type in ("grpo", "luspo") else {}
    _loss_vs_float64(GRPOLossConfig(loss_type=loss_type, beta=0.04, entropy_coef=0.01, **sequence))


def test_bf16_loss_with_a_soft_cap_matches_float64():
    problem = make_problem(seed=22, B=2, T=7, H=16, V=40, dtype=torch.bfloat16, logit_scale=2.0)
    cap = LogitTransform(scale=1.2, softcap=3.0)
    config = GRPOLossConfig(beta=0.04)
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend="triton_tma", logit_transform=cap)
    ref_out, ref_grads = run_loss(fused_linear_grpo_loss, as_float64(problem), config, backend="reference",
                                  logit_transform=cap)
    assert_output_matches(out, grads, ref_out, ref_grads, torch.bfloat16)


def _mean_ratio_loss(x):
    return -x.ratio * x.advantages


def test_a_registered_loss_type_matches_float64():
    grpo_kernels.register_loss_type("chunk_test_ratio", _mean_ratio_loss, "sequence_mean", token_level=True)
    try:
        _loss_vs_float64(GRPOLossConfig(loss_type="chunk_test_ratio", beta=0.04), seed=23)
    finally:
        unregister_loss_type("chunk_test_ratio")


def test_the_registry_entry_declares_what_the_tests_show():
    spec = get_backend("triton_tma")
    assert spec.deterministic and spec.batch_invariant and spec.vocab_shards and spec.kept_token_sets
    assert spec.token_level_route is not None and spec.token_level_route.name == "one_pass"
    assert isinstance(spec.backend(1 << 20), TmaChunkBackend)


def test_log_probs_over_kept_sets_match_float64():
    problem = make_problem(seed=11, B=2, T=6, H=24, V=90)
    kept = kept_sets(problem.completion_ids, 90, 7, seed=1)
    leaves = [x.detach().clone().requires_grad_() for x in (problem.hidden, problem.weight, problem.bias)]
    lp, ent = linear_logprobs(leaves[0], leaves[1], problem.completion_ids, bias=leaves[2], temperature=0.8,
                              return_entropy=True, backend="triton_tma", kept_token_ids=kept)
    ((lp * torch.linspace(-1, 1, lp.numel()).view_as(lp)).sum() + 0.3 * ent.sum()).backward()
    p64 = as_float64(problem)
    ref_leaves = [x.clone().requires_grad_() for x in (p64.hidden, p64.weight, p64.bias)]
    ref_lp, ref_ent = reference.linear_logprobs(ref_leaves[0], ref_leaves[1], p64.completion_ids, bias=ref_leaves[2],
                                                temperature=0.8, return_entropy=True, kept_token_ids=kept)
    ((ref_lp * torch.linspace(-1, 1, lp.numel()).double().view_as(lp)).sum() + 0.3 * ref_ent.sum()).backward()
    torch.testing.assert_close(lp.detach().double(), ref_lp.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent.detach().double(), ref_ent.detach(), atol=1e-5, rtol=1e-5)
    for name, leaf, ref_leaf in zip(("hidden", "weight", "bias"), leaves, ref_leaves):
        assert_grad_close(leaf.grad, ref_leaf.grad, torch.float32, f"d{name}")
