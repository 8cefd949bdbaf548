"""backend="auto": which path each operation takes on a CUDA device, decided without one, and results through auto
equal to the chosen backend's (on CPU tensors, with the device description of an H100)."""

import dataclasses

import pytest
import torch
from grpo_testing import INTERPRETER, make_problem, run_loss

from grpo_kernels import GRPOLossConfig, LMHead, LogitTransform, fused_linear_grpo_loss, linear_logprobs, routing
from grpo_kernels.cost_model import DEVICES, PER_TOKEN_BYTES
from grpo_kernels.backends import DEFAULT_WORKSPACE_BYTES, auto_candidates, get_backend
from grpo_kernels.cost_model.paths import chunked_logits_peak_bytes

H100 = routing.DeviceSpec("cuda", "NVIDIA H100 80GB HBM3")
S1, S2, S3 = (8192, 4096, 151936), (16384, 2048, 248320), (65536, 1536, 151936)


def _rows(route, vocab):
    return route.workspace_bytes // (4 * vocab)


@pytest.mark.parametrize("operation", ["token", "sequence", "frozen", "logprobs"])
def test_every_operation_at_s1_to_s3_takes_the_modelled_fastest_path_in_balanced_whole_tile_waves_on_h100(operation):
    for tokens, hidden, vocab in (S1, S2, S3):
        route = routing.route(operation, tokens, hidden, vocab, "bfloat16", H100)
        if route.backend == "triton":
            # the one-GEMM-equivalent forward on 128 x 128 tiles: the model may find it fastest for log-probs only
            # (the training step's backward recomputes the logits once per gradient: 5 GEMM-equivalents)
            assert operation == "logprobs", (operation, tokens, route)
            continue
        assert route.backend == "gemm", (operation, tokens, route)
        assert route.workspace_bytes <= routing.DEFAULT_MEMORY_BUDGET_BYTES
        rows = _rows(route, vocab)
        p = routing.problem_for(operation, tokens, hidden, vocab, "bfloat16")
        # whole tiles of rows, one wave of all, or the most rows the memory it was chosen within holds
        most = routing._budget_rows(p, min(routing.DEFAULT_MEMORY_BUDGET_BYTES, chunked_logits_peak_bytes(p)))
        assert rows % DEVICES["H100"].gemm_tile[0] == 0 or rows in (tokens, most), (operation, rows)
        assert "H100" in route.reason and route.predicted_s > 0


def _candidates(p, rates, budget):
    """(estimate, backend, workspace) of every auto candidate at whole GEMM tile rows whose peak fits `budget`."""
    tile_rows, row_bytes = rates.gemm_tile[0], 4 * p.vocab
    for backend in auto_candidates():
        uses_workspace = get_backend(backend).uses_workspace
        for workspace in ([rows * row_bytes for rows in range(tile_rows, p.valid_tokens + 1, tile_rows)]
                          if uses_workspace else [p.workspace_bytes]):
            other = get_backend(backend).cost_model()(dataclasses.replace(p, workspace_bytes=workspace))
            if other.peak_extra_bytes <= budget:
                yield other, backend, workspace


@pytest.mark.parametrize("operation", ["token", "sequence", "frozen", "logprobs"])
def test_auto_takes_the_models_fastest_candidate_within_the_budget(operation):
    """Whatever the cost model predicts: auto's pick at S1 on H100 with a given budget fits it, and no candidate
    of `auto` at any workspace of whole GEMM tile rows the budget holds is predicted faster (beyond
    TIME_TOLERANCE)."""
    rates, budget = DEVICES["H100"], routing.DEFAULT_MEMORY_BUDGET_BYTES
    p = routing.problem_for(operation, *S1, "bfloat16")
    chosen = routing.route(operation, *S1, "bfloat16", H100, budget_bytes=budget)
    estimate = get_backend(chosen.backend).cost_model()(dataclasses.replace(p, workspace_bytes=chosen.workspace_bytes))
    assert estimate.peak_extra_bytes <= budget
    compared = 0
    for other, backend, workspace in _candidates(p, rates, budget):
        compared += 1
        assert chosen.predicted_s <= other.seconds(rates) * (1 + routing.TIME_TOLERANCE), (backend, workspace)
    assert compared > 1


@pytest.mark.parametrize("operation", ["token", "sequence", "frozen", "logprobs"])
def test_without_a_budget_auto_prefers_the_usual_fused_heads_memory_while_the_time_allows(operation):
    """No budget from the call: the fastest candidate within the memory of the usual fused head (16-bit logits
    tiles) when its modelled time is within PREFERRED_MEMORY_TIME_TOLERANCE of the fastest within the default
    budget, else that fastest."""
    rates = DEVICES["H100"]
    for shape in (S1, S2, S3):
        p = routing.problem_for(operation, *shape, "bfloat16")
        chosen = routing.route(operation, *shape, "bfloat16", H100)
        in_default = routing.route(operation, *shape, "bfloat16", H100,
                                   budget_bytes=routing.DEFAULT_MEMORY_BUDGET_BYTES)
        preferred = min(routing.DEFAULT_MEMORY_BUDGET_BYTES, chunked_logits_peak_bytes(p))
        peak = get_backend(chosen.backend).cost_model()(
            dataclasses.replace(p, workspace_bytes=chosen.workspace_bytes)).peak_extra_bytes
        if chosen == in_default:
            smaller = routing.route(operation, *shape, "bfloat16", H100, budget_bytes=preferred)
            assert smaller.predicted_s > in_default.predicted_s * (1 + routing.PREFERRED_MEMORY_TIME_TOLERANCE) \
                or smaller == in_default, (operation, shape)
            continue
        assert peak <= preferred and "usual fused head" in chosen.reason
        assert chosen.predicted_s <= in_default.predicted_s * (1 + routing.PREFERRED_MEMORY_TIME_TOLERANCE)
        for other, backend, workspace in _candidates(p, rates, preferred):
            assert chosen.predicted_s <= other.seconds(rates) * (1 + routing.TIME_TOLERANCE), (backend, workspace)
    # at S1 the token-level loss takes the smaller workspace (the model: about 10% slower, half the memory)
    s1 = routing.route("token", *S1, "bfloat16", H100)
    assert "usual fused head" in s1.reason


def test_a_budget_the_gemm_path_cannot_fit_routes_to_the_triton_kernels():
    # one float32 logits row of a 151936 vocabulary is 0.6 MB: a 0.5 MiB budget fits no GEMM wave at all
    route = routing.route("logprobs", *S1, "bfloat16", H100, budget_bytes=2**19 + S1[0] * 64)
    assert route.backend == "triton"
    # and with gemm the only backend allowed (a sharded head), the least memory it can take
    gemm_only = routing.route("logprobs", *S1, "bfloat16", H100, budget_bytes=2**19, backends=("gemm",))
    assert (gemm_only.backend, _rows(gemm_only, S1[2])) == ("gemm", 1)


@pytest.mark.parametrize("operation", ["token", "sequence", "frozen", "logprobs"])
def test_a_budget_below_the_gemm_paths_minimum_useful_workspace_routes_to_the_triton_kernels(operation):
    """Waves thinner than one GEMM tile of rows are not worth running: below that workspace, auto takes the
    streaming kernels even where their own peak (the float32 dH accumulator) exceeds the budget."""
    tile_rows = DEVICES["H100"].gemm_tile[0]
    for tokens, hidden, vocab in (S1, S2, S3):
        minimum = tile_rows * 4 * vocab + tokens * PER_TOKEN_BYTES
        below = routing.route(operation, tokens, hidden, vocab, "bfloat16", H100, budget_bytes=minimum - 1)
        assert below.backend == "triton", (operation, tokens, below)
        if operation != "logprobs":  # at the minimum the GEMM path is back (the kernels' dH accumulator does not fit)
            at = routing.route(operation, tokens, hidden, vocab, "bfloat16", H100, budget_bytes=minimum)
            assert (at.backend, _rows(at, vocab)) == ("gemm", tile_rows), (operation, tokens, at)
    # with fewer tokens than a tile, the minimum is one wave of all of them
    tokens, hidden, vocab = 100, 4096, 151936
    whole = tokens * 4 * vocab + tokens * PER_TOKEN_BYTES
    p = routing.problem_for(operation, tokens, hidden, vocab, "bfloat16")
    assert routing.holds_useful_workspace(p, DEVICES["H100"], whole)
    assert not routing.holds_useful_workspace(p, DEVICES["H100"], whole - 1)
    assert routing.route(operation, tokens, hidden, vocab, "bfloat16", H100, budget_bytes=whole - 1).backend == "triton"


def test_where_the_model_says_the_triton_kernels_are_fastest_auto_takes_them(monkeypatch):
    """auto picks by the model alone: a Triton model that beats the GEMM path's wins."""
    from grpo_kernels.backends import BACKENDS
    from grpo_kernels.cost_model import paths

    def faster(p):
        return paths.Estimate("fused Triton streaming kernels", p, [paths.Phase("all", flops=1.0)], gemms=1,
                              peak_extra_bytes=0, fp32_weight_grad_bytes=0)

    monkeypatch.setattr(paths, "triton", faster)
    routing._cached_route.cache_clear()
    try:
        for operation in ("token", "sequence", "frozen", "logprobs"):
            assert routing.route(operation, *S1, "bfloat16", H100).backend == "triton", operation
    finally:
        routing._cached_route.cache_clear()
    assert BACKENDS["triton"].cost_model() is faster


def test_a_backend_that_would_take_two_steps_is_charged_as_the_sequence_level_loss():
    token = routing.route("token", *S1, "bfloat16", H100)
    two_step = routing.route("token", *S1, "bfloat16", H100, two_pass=("gemm",))
    sequence = routing.route("sequence", *S1, "bfloat16", H100)
    assert two_step.predicted_s == sequence.predicted_s > token.predicted_s


def test_cpu_unmodelled_gpus_and_float32_keep_the_gemm_path_with_its_default_workspace():
    v100 = routing.DeviceSpec("cuda", "Tesla V100")
    for device, dtype in [(routing.DeviceSpec("cpu"), "bfloat16"), (v100, "bfloat16"), (H100, "float32")]:
        route = routing.route("token", *S1, dtype, device)
        assert (route.backend, route.workspace_bytes) == ("gemm", DEFAULT_WORKSPACE_BYTES)
        assert "not modelled" in route.reason


def test_operation_of_a_call():
    assert routing.operation_of(grads=False, token_level=True, weight_grad=False) == "logprobs"
    assert routing.operation_of(grads=True, token_level=False, weight_grad=True) == "sequence"
    assert routing.operation_of(grads=True, token_level=True, weight_grad=False) == "frozen"
    assert routing.operation_of(grads=True, token_level=True, weight_grad=True) == "token"


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="memory budget"):
        routing.route("token", *S1, "bfloat16", H100, budget_bytes=0)
    with pytest.raises(ValueError, match="operation"):
        routing.route("train", *S1, "bfloat16", H100)


def _as_h100(monkeypatch):
    """CPU tensors routed as if on an H100: what auto decides there, run here."""
    monkeypatch.setattr(routing, "device_spec", lambda device: H100)
    routing._cached_route.cache_clear()


@pytest.mark.parametrize("budget, triton_routable, backend", [
    pytest.param(None, True, "triton", marks=INTERPRETER),  # 16 tokens: the kernels are the fastest by the model
    pytest.param(3 * 4 * 64 + 16 * 64, True, "triton", marks=INTERPRETER),  # below one wave of all 16 rows
    (None, False, "gemm"), (3 * 4 * 64 + 16 * 64, False, "gemm")],  # the entry says auto may not pick Triton
    ids=["default", "three-rows", "gemm-default", "gemm-three-rows"])
def test_loss_through_auto_equals_the_chosen_backend(monkeypatch, budget, triton_routable, backend):
    import dataclasses

    from grpo_kernels.backends import BACKENDS

    _as_h100(monkeypatch)
    monkeypatch.setitem(BACKENDS, "triton", dataclasses.replace(BACKENDS["triton"], auto=triton_routable))
    problem = make_problem(seed=3, B=2, T=8, H=16, V=64, dtype=torch.bfloat16)
    config = GRPOLossConfig(beta=0.04)
    chosen = routing.route("token", 16, 16, 64, "bfloat16", H100, budget)
    assert chosen.backend == backend
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend="auto", workspace_bytes=budget)
    same, same_grads = run_loss(fused_linear_grpo_loss, problem, config, backend=chosen.backend,
                                workspace_bytes=chosen.workspace_bytes)
    assert torch.equal(out.loss, same.loss) and torch.equal(out.logps, same.logps)
    for name in grads:
        assert torch.equal(grads[name], same_grads[name]), name


@INTERPRETER  # 16 tokens of no-grad log-probs: the Triton kernels by the model
def test_no_grad_logprobs_through_auto_equal_the_chosen_backend(monkeypatch):
    _as_h100(monkeypatch)
    problem = make_problem(seed=4, B=2, T=8, H=16, V=64, dtype=torch.bfloat16)
    chosen = routing.route("logprobs", 16, 16, 64, "bfloat16", H100)
    with torch.no_grad():
        auto = linear_logprobs(problem.hidden, problem.weight, problem.completion_ids, bias=problem.bias)
        same = linear_logprobs(problem.hidden, problem.weight, problem.completion_ids, bias=problem.bias,
                               backend=chosen.backend, workspace_bytes=chosen.workspace_bytes)
    assert torch.equal(auto, same)


def test_inside_a_compiled_graph_auto_is_the_gemm_path_with_the_default_workspace(monkeypatch):
    _as_h100(monkeypatch)
    hidden = torch.zeros(8192, 4096, dtype=torch.bfloat16, requires_grad=True)
    head = LMHead(torch.zeros(151936, 1, dtype=torch.bfloat16, requires_grad=True))
    config = GRPOLossConfig()
    eager = routing.resolve("auto", None, hidden, head, config)
    assert eager[1] != DEFAULT_WORKSPACE_BYTES  # modelled
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert routing.resolve("auto", None, hidden, head, config) == ("gemm", DEFAULT_WORKSPACE_BYTES)
    assert routing.resolve("triton", None, hidden, head, config) == ("triton", DEFAULT_WORKSPACE_BYTES)


def test_auto_chooses_among_the_backends_that_support_the_call(monkeypatch):
    """A backend `auto` may pick drops out of the candidates for a call needing what its entry does not declare."""
    import dataclasses

    from grpo_kernels.backends import BACKENDS

    _as_h100(monkeypatch)
    hidden = torch.zeros(8192, 4096, dtype=torch.bfloat16, requires_grad=True)
    softcapped = LMHead(torch.zeros(151936, 1, dtype=torch.bfloat16), transform=LogitTransform(softcap=30.0))
    tiny = 2**19 + 8192 * PER_TOKEN_BYTES  # below the GEMM path's minimum: triton when it may
    assert routing.resolve("auto", tiny, hidden, softcapped)[0] == "triton"
    monkeypatch.setitem(BACKENDS, "triton", dataclasses.replace(BACKENDS["triton"], logit_transforms=False))
    routing._cached_route.cache_clear()
    assert routing.resolve("auto", tiny, hidden, softcapped)[0] == "gemm"
    assert routing.resolve("auto", tiny, hidden, LMHead(softcapped.weight))[0] == "triton"
    routing._cached_route.cache_clear()


def test_a_loss_separable_by_sequence_gets_a_workspace_whose_store_holds_its_longest_sequence_at_s1():
    """GSPO off-policy at S1 (1024-row sequences): auto sizes the workspace for waves of whole sequences (three
    GEMM-equivalents) within the usual fused head's memory; without sequence rows, the two-pass route's."""
    from grpo_kernels.cost_model.paths import sequence_store_layout

    tokens, hidden, vocab = S1
    waves = routing.route("sequence", tokens, hidden, vocab, "bfloat16", H100, sequence_rows=1024)
    two_pass = routing.route("sequence", tokens, hidden, vocab, "bfloat16", H100)
    assert waves.backend == two_pass.backend == "gemm"
    assert sequence_store_layout(tokens, vocab, 2, waves.workspace_bytes)[1] >= 1024
    assert sequence_store_layout(tokens, vocab, 2, two_pass.workspace_bytes)[1] < 1024
    assert waves.predicted_s < 0.9 * two_pass.predicted_s
    p = routing.problem_for("sequence", tokens, hidden, vocab, "bfloat16", waves.workspace_bytes, sequence_rows=1024)
    assert get_backend("gemm").cost_model()(p).peak_extra_bytes <= chunked_logits_peak_bytes(p)


def test_auto_passes_the_longest_sequence_to_the_route_only_where_the_waves_may_apply(monkeypatch):
    seen = []
    resolve = routing.resolve

    def spy(*args, sequence_rows=0, **kwargs):
        seen.append(sequence_rows)
        return resolve(*args, sequence_rows=sequence_rows, **kwargs)

    monkeypatch.setattr(routing, "resolve", spy)
    problem = make_problem(seed=5, B=3, T=8, H=16, V=64, dtype=torch.float32)
    longest = int(problem.completion_mask.sum(-1).max())
    for config, expected in ((GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence"), longest),
                             (GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence",
                                             entropy_coef=0.1), 0),
                             (GRPOLossConfig(loss_type="dapo"), 0)):
        seen.clear()
        run_loss(fused_linear_grpo_loss, problem, config, backend="auto")
        assert seen == [expected], config
