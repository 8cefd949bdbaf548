"""backend="auto": which path each operation takes on a CUDA device, decided without one, and results through auto
equal to the chosen backend's (on CPU tensors, with the device description of an H100)."""

import pytest
import torch
from grpo_testing import make_problem, run_loss

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, linear_logprobs, routing
from grpo_kernels.cost_model import DEVICES
from grpo_kernels.backends.gemm import DEFAULT_WORKSPACE_BYTES

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
        assert rows % DEVICES["H100"].gemm_tile[0] == 0 or rows == tokens, (operation, rows)
        assert "H100" in route.reason and route.predicted_s > 0


def test_s1_token_level_waves_are_eight_of_1024_rows():
    route = routing.route("token", *S1, "bfloat16", H100)
    # 8192 tokens: 8 waves of 1024 rows (594 MiB), not the old fixed 1 GiB's 5 waves of 1767 with a ragged last one
    assert (route.backend, _rows(route, S1[2])) == ("gemm", 1024)


def test_a_budget_the_gemm_path_cannot_fit_routes_to_the_triton_kernels():
    # one float32 logits row of a 151936 vocabulary is 0.6 MB: a 0.5 MiB budget fits no GEMM wave at all
    route = routing.route("logprobs", *S1, "bfloat16", H100, budget_bytes=2**19 + S1[0] * 64)
    assert route.backend == "triton"
    # and with gemm the only backend allowed (a sharded head), the least memory it can take
    gemm_only = routing.route("logprobs", *S1, "bfloat16", H100, budget_bytes=2**19, backends=("gemm",))
    assert (gemm_only.backend, _rows(gemm_only, S1[2])) == ("gemm", 1)


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


@pytest.mark.parametrize("budget", [None, 3 * 4 * 64 + 16 * 64], ids=["default", "three-rows"])
def test_loss_through_auto_equals_the_chosen_backend(monkeypatch, budget):
    _as_h100(monkeypatch)
    problem = make_problem(seed=3, B=2, T=8, H=16, V=64, dtype=torch.bfloat16)
    config = GRPOLossConfig(beta=0.04)
    chosen = routing.route("token", 16, 16, 64, "bfloat16", H100,
                           routing.DEFAULT_MEMORY_BUDGET_BYTES if budget is None else budget)
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend="auto", workspace_bytes=budget)
    same, same_grads = run_loss(fused_linear_grpo_loss, problem, config, backend=chosen.backend,
                                workspace_bytes=chosen.workspace_bytes)
    assert torch.equal(out.loss, same.loss) and torch.equal(out.logps, same.logps)
    for name in grads:
        assert torch.equal(grads[name], same_grads[name]), name


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
    head = type("Head", (), {"weight": torch.zeros(151936, 1, dtype=torch.bfloat16),
                             "weight_needs_grad": lambda self: True})()
    eager = routing.resolve("auto", None, hidden, head, token_level=True)
    assert eager[1] != DEFAULT_WORKSPACE_BYTES  # modelled
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert routing.resolve("auto", None, hidden, head, token_level=True) == ("gemm", DEFAULT_WORKSPACE_BYTES)
    assert routing.resolve("triton", None, hidden, head, token_level=True) == ("triton", DEFAULT_WORKSPACE_BYTES)
