"""A sequence-level loss separable by sequence in one pass over waves of whole sequences on the GEMM path
(grpo_kernels/sequence_route.py, backends/gemm.py: stream_sequence_waves): the same loss, metrics, log-probs and
gradients as the float64 reference, where the route applies; the two-pass route wherever one of its conditions fails."""

import functools
import warnings

import pytest
import torch
from grpo_testing import as_float64, assert_output_matches, make_problem, run_loss
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_kernels import GRPOLossConfig, LogitTransform, fused_linear_grpo_loss, reference, sequence_route
from grpo_kernels.sequence_route import sequence_waves
from grpo_kernels.backends import gemm
from grpo_kernels.backends.gemm import GemmBackend, triton_rows
from grpo_kernels.cost_model.paths import SEQUENCE_SCRATCH_ROWS as SCRATCH_ROWS
from grpo_kernels.cost_model.paths import sequence_store_layout as store_layout
from grpo_kernels.config import LossConfigWarning
from grpo_kernels.losses import BUILTIN_LOSS_TYPES, get_loss_type, register_loss_type, unregister_loss_type
from grpo_kernels.objective import is_token_level, sequence_waves_apply

SEPARABLE = [name for name in BUILTIN_LOSS_TYPES if get_loss_type(name).separable_by_sequence]


def _config(**kwargs) -> GRPOLossConfig:
    kwargs.setdefault("importance_sampling_level", "sequence")
    with warnings.catch_warnings():  # GSPO's level with a token-normalised type warns, as TRL does
        warnings.simplefilter("ignore", LossConfigWarning)
        return GRPOLossConfig(**kwargs)


@pytest.fixture
def waves_taken(monkeypatch):
    """The waves of every call that took the route, in order."""
    taken: list = []
    run = sequence_route.sequence_level_in_waves

    def spy(backend, waves, *args, **kwargs):
        taken.append(waves)
        return run(backend, waves, *args, **kwargs)

    monkeypatch.setattr(sequence_route, "sequence_level_in_waves", spy)
    return taken


def _workspace(problem, store_rows: int) -> int:
    """A workspace whose store holds `store_rows` rows of the CPU's GEMM operands (float32; float64 for float64)."""
    rows = int(problem.completion_mask.sum())
    V = problem.weight.shape[0]
    itemsize = 8 if problem.hidden.dtype == torch.float64 else 4
    return min(SCRATCH_ROWS, rows) * V * itemsize + store_rows * V * itemsize


def _check(problem, config, dtype, **kwargs):
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend="gemm", **kwargs)
    ref_out, ref_grads = run_loss(reference.fused_linear_grpo_loss, as_float64(problem), config)
    assert_output_matches(out, grads, ref_out, ref_grads, dtype)


def test_every_built_in_loss_type_is_separable_by_sequence():
    assert SEPARABLE == list(BUILTIN_LOSS_TYPES)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(loss_type=st.sampled_from(SEPARABLE), level=st.sampled_from(["sequence", "token"]),
       beta=st.sampled_from([0.0, 0.04]), bias_correction=st.booleans(), delta=st.sampled_from([None, 1.5]),
       store_sequences=st.integers(1, 4), with_bias=st.booleans(), packed=st.booleans(),
       rho=st.sampled_from([None, "token", "sequence"]), token_advantages=st.booleans(), seed=st.integers(0, 10**6))
def test_waves_match_the_float64_reference(waves_taken, loss_type, level, beta, bias_correction, delta,
                                           store_sequences, with_bias, packed, rho, token_advantages, seed):
    waves_taken.clear()  # the fixture lives across hypothesis's examples
    config = _config(loss_type=loss_type, importance_sampling_level=level, beta=beta,
                     use_bias_correction_kl=bias_correction, delta=delta)
    if not sequence_waves_apply(config):  # token-level: the one-pass token route, not this one
        assert is_token_level(config)
        return
    dtype = torch.float64
    if get_loss_type(loss_type).folds_importance_ratio and rho == "sequence":
        rho = "token"  # vespo reads rho per token
    problem = make_problem(seed=seed, B=5, T=7, H=12, V=40, dtype=dtype, with_bias=with_bias,
                           importance_ratio=None if packed else rho, token_advantages=token_advantages and not packed)
    workspace = _workspace(problem, store_rows=store_sequences * 7)
    if packed:
        _check_packed(problem, config, workspace)
    else:
        _check(problem, config, dtype, workspace_bytes=workspace)
    assert len(waves_taken) == 1


def _check_packed(problem, config, workspace):
    """The packed form of the same batch (hidden [N, H], cu_seqlens), against the padded float64 reference."""
    mask = problem.completion_mask.bool()
    lengths = mask.sum(-1)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    hidden = problem.hidden[mask].detach().clone().requires_grad_()
    weight = problem.weight.detach().clone().requires_grad_()
    bias = None if problem.bias is None else problem.bias.detach().clone().requires_grad_()
    out = fused_linear_grpo_loss(hidden, weight, problem.completion_ids[mask], None, problem.advantages,
                                 bias=bias, old_logps=problem.old_logps[mask], ref_logps=problem.ref_logps[mask],
                                 config=config, backend="gemm", cu_seqlens=cu, workspace_bytes=workspace)
    out.loss.backward()
    ref_out, ref_grads = run_loss(reference.fused_linear_grpo_loss, as_float64(problem), config)
    torch.testing.assert_close(out.loss.double(), ref_out.loss, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(out.logps.double(), ref_out.logps[mask].double(), atol=1e-6, rtol=1e-6)
    expected_dh = ref_grads["hidden"][mask]
    torch.testing.assert_close(hidden.grad, expected_dh, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(weight.grad, ref_grads["weight"], atol=1e-12, rtol=1e-10)
    if bias is not None:
        torch.testing.assert_close(bias.grad, ref_grads["bias"], atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_waves_in_16_and_32_bits_with_a_transform(waves_taken, dtype):
    config = _config(loss_type="grpo", beta=0.04, temperature=0.7)
    problem = make_problem(seed=3, B=4, T=9, H=16, V=64, dtype=dtype)
    transform = LogitTransform(scale=0.8, softcap=6.0)
    workspace = _workspace(problem, store_rows=18)
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend="gemm", workspace_bytes=workspace,
                          logit_transform=transform)
    ref_out, ref_grads = run_loss(reference.fused_linear_grpo_loss, as_float64(problem), config,
                                  logit_transform=transform)
    assert_output_matches(out, grads, ref_out, ref_grads, dtype)
    assert len(waves_taken) == 1 and len(waves_taken[0]) == 2


@pytest.mark.parametrize("trained", ["hidden", "weight"])
def test_waves_with_only_hidden_or_only_the_head_trained(waves_taken, trained):
    config = _config(loss_type="grpo", beta=0.04)
    problem = make_problem(seed=4, B=4, T=6, H=12, V=40, dtype=torch.float64)
    results = []
    for fn, extra in ((fused_linear_grpo_loss, {"backend": "gemm", "workspace_bytes": _workspace(problem, 6)}),
                      (reference.fused_linear_grpo_loss, {})):
        hidden = problem.hidden.detach().clone().requires_grad_(trained == "hidden")
        weight = problem.weight.detach().clone().requires_grad_(trained == "weight")
        out = fn(hidden, weight, problem.completion_ids, problem.completion_mask, problem.advantages, config=config,
                 **{**problem.loss_kwargs(), "bias": problem.bias}, **extra)
        out.loss.backward()
        results.append((out.loss, hidden.grad if trained == "hidden" else weight.grad))
    (loss, grad), (ref_loss, ref_grad) = results
    torch.testing.assert_close(loss, ref_loss, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(grad, ref_grad, atol=1e-12, rtol=1e-10)
    assert len(waves_taken) == 1


def test_cuda_data_flow_of_the_waves_on_cpu(monkeypatch, waves_taken):
    """16-bit GEMM operands and store, Q narrowed by the Triton row kernel at the GPU's block size over row
    segments (interpreted), the statistics per segment, the dW waves added into the float32 accumulator."""
    if torch.cuda.is_available():
        pytest.skip("runs the CUDA flow under the Triton interpreter, which is on only without CUDA")
    monkeypatch.setattr(gemm, "GemmBackend", functools.partial(
        GemmBackend, rows=triton_rows(gpu_launch=True, min_segment=512), gemm_in_input_dtype=True))
    V = 2048  # four segments of 512 a row
    config = _config(loss_type="grpo", beta=0.04)
    problem = make_problem(seed=5, B=3, T=6, H=32, V=V, dtype=torch.bfloat16, with_bias=False)
    rows = int(problem.completion_mask.sum())
    workspace = min(SCRATCH_ROWS, rows) * V * 4 + 7 * V * 2  # a store of 7 bf16 rows: a sequence a wave
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend="gemm", workspace_bytes=workspace)
    ref_out, ref_grads = run_loss(reference.fused_linear_grpo_loss, as_float64(problem), config)
    assert_output_matches(out, grads, ref_out, ref_grads, torch.bfloat16)
    lengths = problem.completion_mask.sum(-1).tolist()
    assert waves_taken == [sequence_waves(lengths, 7)] and len(waves_taken[0]) >= 2


@pytest.mark.parametrize("change", ["entropy_coef", "top_entropy_quantile", "small_store", "no_grad",
                                    "kept_sets"])
def test_two_passes_where_a_condition_fails(waves_taken, change):
    config = _config(loss_type="grpo", beta=0.04,
                     **({"entropy_coef": 0.1} if change == "entropy_coef" else {}),
                     **({"top_entropy_quantile": 0.5} if change == "top_entropy_quantile" else {}))
    problem = make_problem(seed=7, B=3, T=6, H=12, V=40, dtype=torch.float64)
    workspace = _workspace(problem, store_rows=5 if change == "small_store" else 12)
    kwargs = {"workspace_bytes": workspace}
    if change == "kept_sets":
        ids = problem.completion_ids
        kwargs["kept_token_ids"] = torch.stack([ids, (ids + 1) % 40, (ids + 2) % 40], -1)
    if change == "no_grad":
        with torch.no_grad():
            fused_linear_grpo_loss(problem.hidden, problem.weight, problem.completion_ids, problem.completion_mask,
                                   problem.advantages, config=config, backend="gemm", **problem.loss_kwargs(),
                                   **kwargs)
    elif change == "kept_sets":
        out, _ = run_loss(fused_linear_grpo_loss, problem, config, backend="gemm", **kwargs)
        ref_out, _ = run_loss(reference.fused_linear_grpo_loss, problem, config,
                              kept_token_ids=kwargs["kept_token_ids"])
        torch.testing.assert_close(out.loss, ref_out.loss, atol=1e-12, rtol=1e-12)
    else:
        _check(problem, config, torch.float64, **kwargs)
    assert waves_taken == []


def test_a_registered_loss_type_takes_the_waves_only_when_declared_separable(waves_taken):
    def term(x):  # GSPO's clipped surrogate, written by a user
        return -torch.minimum(x.ratio * x.advantages, x.ratio.clamp(0.8, 1.2) * x.advantages)

    problem = make_problem(seed=9, B=4, T=6, H=12, V=40, dtype=torch.float64)
    workspace = _workspace(problem, store_rows=12)
    try:
        for separable in (False, True):
            register_loss_type("user_gspo", term, "sequence_mean", separable_by_sequence=separable, replace=True)
            _check(problem, _config(loss_type="user_gspo"), torch.float64, workspace_bytes=workspace)
            assert len(waves_taken) == int(separable)
    finally:
        unregister_loss_type("user_gspo")


def test_the_separability_declaration_is_needed(waves_taken):
    """A term that reads other sequences (each sequence's ratio against the batch's mean ratio), declared separable,
    trains differently through the waves: the declaration is what makes the route exact."""
    def coupled(x):
        return -(x.ratio / x.ratio.detach().mean() * x.ratio) * x.advantages

    problem = make_problem(seed=11, B=4, T=6, H=12, V=40, dtype=torch.float64)
    try:
        register_loss_type("coupled", coupled, "sequence_mean", separable_by_sequence=True)
        config = _config(loss_type="coupled")
        out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend="gemm",
                              workspace_bytes=_workspace(problem, store_rows=6))
        ref_out, ref_grads = run_loss(reference.fused_linear_grpo_loss, problem, config)
    finally:
        unregister_loss_type("coupled")
    assert len(waves_taken) == 1 and len(waves_taken[0]) >= 2
    torch.testing.assert_close(out.loss, ref_out.loss)  # the value comes from the complete batch
    assert not torch.allclose(grads["hidden"], ref_grads["hidden"], atol=1e-6)


def test_waves_are_bitwise_repeatable(waves_taken):
    problem = make_problem(seed=13, B=4, T=8, H=16, V=48, dtype=torch.float32)
    config = _config(loss_type="dapo", beta=0.04)
    runs = [run_loss(fused_linear_grpo_loss, problem, config, backend="gemm",
                     workspace_bytes=_workspace(problem, store_rows=9)) for _ in range(2)]
    (out_a, grads_a), (out_b, grads_b) = runs
    assert torch.equal(out_a.loss, out_b.loss) and torch.equal(out_a.logps, out_b.logps)
    assert all(torch.equal(grads_a[name], grads_b[name]) for name in grads_a)
    assert len(waves_taken) == 2


def test_sequence_waves_group_whole_sequences_within_the_store():
    assert sequence_waves([3, 4, 2, 5, 0, 1], store_rows=7) == [(0, 7), (7, 14), (14, 15)]
    assert sequence_waves([3, 4], store_rows=3) is None  # a sequence longer than the store
    assert sequence_waves([], store_rows=3) == []
    assert store_layout(rows=1000, vocab=100, gemm_itemsize=2, workspace_bytes=SCRATCH_ROWS * 400 + 2000) == \
        (SCRATCH_ROWS, 10)
    assert store_layout(rows=10, vocab=100, gemm_itemsize=4, workspace_bytes=100) == (10, 0)
