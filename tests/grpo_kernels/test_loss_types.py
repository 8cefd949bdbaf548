"""The loss-type spec (grpo_kernels/losses.py): TRL 1.16's clip metrics, and loss types defined outside the package.

Two research losses are registered here, in the test file, through the public `grpo_kernels.register_loss_type`:
prime-rl's DPPO with a binary total-variation trust region (token level) and a geometric-mean sequence mask (a
reduction over each sequence). Each runs on every backend, logits-free, and is checked against a float64 oracle
written here from the logits up (not through the package's objective): loss, dhidden, dweight, dbias.
"""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from grpo_testing import as_float64, make_problem, registered_backends, with_triton_interpreted
from processes import leave_spawned_process

import grpo_kernels
from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, grpo_objective
from grpo_kernels.losses import TRUST_REGION, TermInputs, get_loss_type, loss_type_names, unregister_loss_type

TV_EPSILON = 0.01  # DPPO's trust region on |p - p_old|
SEQUENCE_BAND = (0.9, 1.1)  # the geometric-mean ratio a sequence must stay within


def dppo_binary_tv(x: TermInputs) -> torch.Tensor:
    """prime-rl's DPPO-binary-TV: -r A, except where the token's probability already moved more than TV_EPSILON
    (the total variation of its binary distribution {token, rest}) in the direction A pushes it: no gradient there."""
    p = torch.exp(x.logps)
    p_old = torch.exp(x.logps - x.log_ratio).detach()
    moved_up, moved_down = p.detach() - p_old > TV_EPSILON, p_old - p.detach() > TV_EPSILON
    outside = (moved_up & (x.advantages > 0)) | (moved_down & (x.advantages < 0))
    return -x.ratio * x.advantages * (~outside).to(x.logps.dtype)


def geometric_sequence_mask(x: TermInputs) -> torch.Tensor:
    """-r A over the sequences whose geometric-mean ratio exp(mean_t d) lies in SEQUENCE_BAND; 0 elsewhere."""
    mean_log_ratio = (x.log_ratio * x.mask).sum(-1, keepdim=True) / x.mask.sum(-1, keepdim=True).clamp(min=1.0)
    geometric = torch.exp(mean_log_ratio.detach())
    keep = (geometric >= SEQUENCE_BAND[0]) & (geometric <= SEQUENCE_BAND[1])
    return -x.ratio * x.advantages * keep.to(x.logps.dtype)


def register_research_losses() -> None:
    grpo_kernels.register_loss_type("dppo_binary_tv", dppo_binary_tv, "sequence_mean", token_level=True)
    grpo_kernels.register_loss_type("geo_seq_mask", geometric_sequence_mask, "global_token_mean")


@pytest.fixture(autouse=True, scope="module")
def research_losses():
    register_research_losses()
    yield
    unregister_loss_type("dppo_binary_tv")
    unregister_loss_type("geo_seq_mask")


def oracle(problem, loss_type: str, beta: float):
    """Loss and grads in float64 from the logits, with the two losses written out here (TRL's k3 KL, no rho)."""
    p = as_float64(problem)
    leaves = {name: getattr(p, name).clone().requires_grad_() for name in ("hidden", "weight", "bias")}
    logits = leaves["hidden"] @ leaves["weight"].T + leaves["bias"]
    lp = torch.log_softmax(logits, -1).gather(-1, p.completion_ids[..., None]).squeeze(-1)
    m = p.completion_mask.double()
    A = p.advantages.double()[:, None]
    d = torch.where(m > 0, lp - p.old_logps.double(), 0.0)
    r = torch.exp(d)
    if loss_type == "dppo_binary_tv":
        prob, prob_old = torch.exp(lp).detach(), torch.exp(p.old_logps.double())
        outside = ((prob - prob_old > TV_EPSILON) & (A > 0)) | ((prob_old - prob > TV_EPSILON) & (A < 0))
        L = -r * A * (~outside)
    else:
        geometric = torch.exp(((d * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True)).detach())
        L = -r * A * ((geometric >= SEQUENCE_BAND[0]) & (geometric <= SEQUENCE_BAND[1]))
    if beta:
        delta = torch.where(m > 0, p.ref_logps.double() - lp, 0.0)
        L = L + beta * (torch.exp(delta) - delta - 1) * r  # TRL's default bias-corrected KL
    if loss_type == "dppo_binary_tv":  # per-sequence mean, then over sequences
        loss = ((L * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    else:  # over the batch's tokens
        loss = (L * m).sum() / m.sum()
    loss.backward()
    return loss.detach(), {name: leaf.grad for name, leaf in leaves.items()}


def run_loss(problem, loss_type: str, backend: str, rows: slice = slice(None), **kwargs):
    """The fused loss on `problem`'s head rows `rows` (a vocabulary shard with process_group=), backward done;
    (loss, {hidden, weight, bias: grad})."""
    leaves = {"hidden": problem.hidden.clone().requires_grad_(), "weight": problem.weight[rows].clone().requires_grad_(),
              "bias": problem.bias[rows].clone().requires_grad_()}
    out = fused_linear_grpo_loss(leaves["hidden"], leaves["weight"], problem.completion_ids, problem.completion_mask,
                                 problem.advantages, bias=leaves["bias"], old_logps=problem.old_logps,
                                 ref_logps=problem.ref_logps, config=GRPOLossConfig(loss_type=loss_type, beta=0.04),
                                 backend=backend, **kwargs)
    out.loss.backward()
    return out.loss.detach(), {name: leaf.grad for name, leaf in leaves.items()}


def assert_matches_oracle(loss, grads, problem, loss_type: str, rows: slice = slice(None)) -> None:
    expected_loss, expected = oracle(problem, loss_type, beta=0.04)
    torch.testing.assert_close(loss.double(), expected_loss, rtol=1e-5, atol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grad.double(), expected[name] if name == "hidden" else expected[name][rows],
                                   rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("loss_type", ["dppo_binary_tv", "geo_seq_mask"])
@pytest.mark.parametrize("backend", with_triton_interpreted(registered_backends()))
def test_a_registered_loss_runs_on_every_backend_exact_against_float64(backend, loss_type):
    problem = make_problem(seed=31, B=3, T=6, H=16, V=40, logit_scale=2.0)
    assert_matches_oracle(*run_loss(problem, loss_type, backend), problem, loss_type)


def shard_worker(rank: int, world: int, init_file: str) -> None:
    """One rank of a gloo group: its rows of the head, every backend that takes a shard, both losses."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        register_research_losses()  # a spawned process starts from a fresh interpreter
        problem = make_problem(seed=31, B=3, T=6, H=16, V=41, logit_scale=2.0)
        sizes = (19, 22)  # uneven, and the targets fall on both shards
        rows = slice(sum(sizes[:rank]), sum(sizes[:rank + 1]))
        assert any(problem.completion_ids.flatten() < sizes[0]) and any(problem.completion_ids.flatten() >= sizes[0])
        for backend in registered_backends(vocab_shards=True):  # the package's own: a fresh interpreter
            for loss_type in ("dppo_binary_tv", "geo_seq_mask"):
                try:
                    loss, grads = run_loss(problem, loss_type, backend, rows, process_group=dist.group.WORLD)
                    assert_matches_oracle(loss, grads, problem, loss_type, rows)
                except AssertionError as error:
                    raise AssertionError(f"rank {rank} {backend} {loss_type}: {error}") from error
    finally:
        dist.destroy_process_group()
    leave_spawned_process()


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_only_subprocesses")
def test_a_registered_loss_runs_on_a_vocabulary_shard(tmp_path):
    """Two gloo processes, each holding its rows of the head: the same loss and dH, and its own shard's dW and
    dbias, as the float64 oracle on the whole head."""
    mp.spawn(shard_worker, args=(2, str(tmp_path / "init")), nprocs=2, join=True)


def test_the_research_losses_act_on_these_inputs():
    """The oracle comparison above is only worth something if the masks do mask: some tokens outside the TV region,
    some sequences outside the band, some inside."""
    p = as_float64(make_problem(seed=31, B=3, T=6, H=16, V=40, logit_scale=2.0))
    lp = torch.log_softmax(p.hidden @ p.weight.T + p.bias, -1).gather(-1, p.completion_ids[..., None]).squeeze(-1)
    m = p.completion_mask.double()
    d = torch.where(m > 0, lp - p.old_logps, 0.0)
    x = TermInputs(lp, d, torch.exp(d), p.advantages[:, None], m, None, GRPOLossConfig())
    tv = dppo_binary_tv(x) == 0
    assert 0 < int((tv & (m > 0)).sum()) < int(m.sum())
    kept = geometric_sequence_mask(x)[:, 0] != 0
    assert 0 < int(kept.sum()) < kept.numel()


def test_registered_names_are_config_values_and_unknown_ones_list_them():
    assert {"dppo_binary_tv", "geo_seq_mask"} <= set(loss_type_names())
    assert GRPOLossConfig(loss_type="geo_seq_mask").loss_type == "geo_seq_mask"
    with pytest.raises(ValueError, match=r"loss_type must be one of the registered loss types \('grpo', .*"
                                         r"'dppo_binary_tv', 'geo_seq_mask'\), got 'ppo'"):
        GRPOLossConfig(loss_type="ppo")


def test_a_name_differing_from_a_registered_one_only_in_case_is_refused():
    grpo_kernels.register_loss_type("case_probe", dppo_binary_tv, "sequence_mean")
    try:
        with pytest.raises(ValueError, match="'Case_Probe' differs from the registered loss type 'case_probe' only "
                                             "in case"):
            grpo_kernels.register_loss_type("Case_Probe", dppo_binary_tv, "sequence_mean")
        assert "Case_Probe" not in loss_type_names()
    finally:
        unregister_loss_type("case_probe")


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(name="dapo"), ValueError, "'dapo' is a built-in loss type"),
    (dict(name="GRPO"), ValueError, "'GRPO' differs from the built-in loss type 'grpo' only in case"),
    (dict(name="Dapo"), ValueError, "'Dapo' differs from the built-in loss type 'dapo' only in case"),
    (dict(name="has space"), ValueError, "name must be an ASCII identifier"),
    (dict(term="not callable"), TypeError, "term must be a callable"),
    (dict(aggregation="median"), ValueError, "aggregation must be one of"),
    (dict(clip="both"), ValueError, "clip must be None or one of"),
])
def test_register_loss_type_refuses_bad_definitions(kwargs, error, match):
    args = dict(name="bad_loss", term=dppo_binary_tv, aggregation="sequence_mean") | kwargs
    with pytest.raises(error, match=match):
        grpo_kernels.register_loss_type(args.pop("name"), args.pop("term"), args.pop("aggregation"), **args)


# ---- TRL 1.16's clip metrics: flagged after the delta cap -------------------------------------------------------

def test_clip_metrics_flag_the_ratio_after_the_delta_cap():
    """delta = 1.1 < 1 + epsilon_high = 1.28: a token at r = 1.2 with A > 0 is capped to 1.1, inside the trust
    region, so TRL 1.16 counts it as not clipped (the uncapped ratio, 1.2 < 1.28, is not either); one at r = 1.5
    is capped to 1.1 as well: TRL's high clip ratio reads 0, where flagging the uncapped ratio counted 1 in 2."""
    config = GRPOLossConfig(loss_type="dapo", epsilon_high=0.28, delta=1.1)
    old = torch.zeros(1, 2)
    logps = torch.log(torch.tensor([[1.2, 1.5]]))
    mask, advantages = torch.ones(1, 2), torch.ones(1)
    _, metrics = grpo_objective(logps, torch.zeros(1, 2), mask, advantages, config, old_logps=old)
    assert float(metrics["clip_ratio/high_mean"]) == 0.0 and float(metrics["clip_ratio/region_mean"]) == 0.0
    # the uncapped definition this replaced would have reported 0.5
    uncapped_high = ((torch.exp(logps - old) > 1 + config.epsilon_high_value) & (advantages[:, None] > 0)).float()
    assert float(uncapped_high.mean()) == 0.5
    # without the cap, the same token is flagged
    _, metrics = grpo_objective(logps, torch.zeros(1, 2), mask, advantages,
                                GRPOLossConfig(loss_type="dapo", epsilon_high=0.28), old_logps=old)
    assert float(metrics["clip_ratio/high_mean"]) == 0.5


@pytest.mark.parametrize("backend", with_triton_interpreted(registered_backends()))
def test_every_route_reports_trl_clip_metrics_with_delta_below_one_plus_epsilon_high(backend):
    """The two-step route, the GEMM one-pass and the Triton epilogue all report TRL's definition."""
    problem = make_problem(seed=5, B=3, T=6, H=16, V=40)
    old = problem.old_logps - 0.5 * problem.completion_mask  # ratios well above 1 + epsilon_high
    advantages = problem.advantages.abs() + 0.1
    capped = GRPOLossConfig(loss_type="bnpo", epsilon_high=0.28, delta=1.1)
    out = fused_linear_grpo_loss(problem.hidden, problem.weight, problem.completion_ids, problem.completion_mask,
                                 advantages, bias=problem.bias, old_logps=old, config=capped, backend=backend)
    assert float(out.metrics["clip_ratio/high_mean"]) == 0.0
    uncapped = fused_linear_grpo_loss(problem.hidden, problem.weight, problem.completion_ids, problem.completion_mask,
                                      advantages, bias=problem.bias, old_logps=old,
                                      config=GRPOLossConfig(loss_type="bnpo", epsilon_high=0.28), backend=backend)
    assert float(uncapped.metrics["clip_ratio/high_mean"]) > 0.5


def test_the_spec_names_each_loss_types_clipping_and_aggregation():
    assert get_loss_type("dapo").clip == TRUST_REGION and get_loss_type("dapo").aggregation.token_normalised
    assert get_loss_type("sapo").clip is None and not get_loss_type("grpo").aggregation.token_normalised
    assert get_loss_type("dr_grpo").aggregation.reads_max_completion_length
    assert not get_loss_type("vespo").token_level and get_loss_type("vespo").folds_importance_ratio
