"""Every fused path against the float64 reference: loss, metrics, logps, and the gradients of hidden, weight
and bias, over every loss type and option (tolerances in grpo_testing.py)."""

import pytest
import torch
from grpo_testing import (FUSED_BACKENDS, as_float64, assert_grad_close, assert_loss_close, assert_output_matches,
                          device_of, loss_config, make_problem, run_loss, runs_triton)
from loss_configs import CONFIGS, head_kwargs, importance_ratio_kind

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, grpo_loss_from_logits, reference

DTYPES = [torch.float32, torch.bfloat16]


def _config(name):
    return loss_config(**CONFIGS[name])  # a combination that departs from its paper warns, asserted there


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("backend", FUSED_BACKENDS)
def test_fused_linear_matches_float64_reference(backend, config_name, dtype):
    problem = make_problem(seed=sum(map(ord, config_name)), dtype=dtype, device=device_of(backend),
                           importance_ratio=importance_ratio_kind(config_name))
    config = _config(config_name)
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend=backend, **head_kwargs(config_name))
    ref_out, ref_grads = run_loss(reference.fused_linear_grpo_loss, as_float64(problem), config,
                                  **head_kwargs(config_name))
    assert_output_matches(out, grads, ref_out, ref_grads, dtype)


@pytest.mark.parametrize("config_name", ["scale_softcap_entropy_bonus", "scale_softcap_gspo_entropy"])
@pytest.mark.parametrize("backend", FUSED_BACKENDS)
def test_frozen_transformed_head(backend, config_name):
    """A frozen head (the LoRA case) whose logits are soft-capped: the hidden gradient of the reference, none for
    the head, on the one-pass (token-level) and the two-step (sequence-level) routes."""
    problem = make_problem(seed=12, device=device_of(backend), importance_ratio="token")
    config = _config(config_name)
    results = []
    for fn, p, kwargs in ((fused_linear_grpo_loss, problem, dict(backend=backend)),
                          (reference.fused_linear_grpo_loss, as_float64(problem), {})):
        hidden = p.hidden.clone().requires_grad_()
        out = fn(hidden, p.weight, p.completion_ids, p.completion_mask, p.advantages, config=config,
                 **p.loss_kwargs(), **kwargs, **head_kwargs(config_name))
        out.loss.backward()
        results.append((out, hidden.grad))
    (out, grad), (ref_out, ref_grad) = results
    assert_loss_close(out.loss, ref_out.loss, torch.float32)
    assert_grad_close(grad, ref_grad, torch.float32, "dhidden")
    assert problem.weight.grad is None and problem.bias.grad is None


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("backend", FUSED_BACKENDS)
def test_several_seeds_token_advantages_and_sequence_rho(backend, seed):
    problem = make_problem(seed=seed, B=4, T=6, importance_ratio="sequence", token_advantages=True,
                           device=device_of(backend))
    config = GRPOLossConfig(loss_type="grpo", beta=0.04, epsilon_high=0.3)
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend=backend)
    ref_out, ref_grads = run_loss(reference.fused_linear_grpo_loss, as_float64(problem), config)
    assert_output_matches(out, grads, ref_out, ref_grads, torch.float32)


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
@pytest.mark.parametrize("shape", [dict(B=1, T=1, H=5, V=3), dict(B=2, T=3, H=17, V=65), dict(B=3, T=4, H=64, V=129)],
                         ids=["T1_tiny", "odd_H_V65", "V129"])
def test_shapes_off_the_tile_grid(backend, shape):
    problem = make_problem(seed=7, **shape, device=device_of(backend))
    config = GRPOLossConfig(beta=0.04, entropy_coef=0.01)
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend=backend)
    ref_out, ref_grads = run_loss(reference.fused_linear_grpo_loss, as_float64(problem), config)
    assert_output_matches(out, grads, ref_out, ref_grads, torch.float32)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "luspo"])
@pytest.mark.parametrize("backend", FUSED_BACKENDS)
def test_all_masked_rows_and_fully_masked_batch(backend, loss_type):
    for masked_rows in (2, 3):  # two of three rows, then the whole batch
        problem = make_problem(seed=11, B=3, masked_rows=masked_rows, device=device_of(backend))
        config = loss_config(loss_type=loss_type, beta=0.04)
        out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend=backend)
        ref_out, ref_grads = run_loss(reference.fused_linear_grpo_loss, as_float64(problem), config)
        assert_output_matches(out, grads, ref_out, ref_grads, torch.float32)
        assert torch.isfinite(out.loss)
        if masked_rows == 3:
            assert float(out.loss.detach()) == 0.0 and float(grads["hidden"].abs().max()) == 0.0


# One 4096-token row takes 15-20 s per Triton backend under the interpreter: the fast tier runs it on `triton`,
# the slow tier on the other backends that run Triton kernels (on a CPU they share `triton`'s forward).
LONG_ROW_BACKENDS = [pytest.param(backend, marks=pytest.mark.slow) if runs_triton(backend) and backend != "triton"
                     else backend for backend in FUSED_BACKENDS]


@pytest.mark.parametrize("backend", LONG_ROW_BACKENDS)
def test_long_rows(backend):
    problem = make_problem(seed=3, B=1, T=4096, H=16, V=40, with_bias=False, device=device_of(backend))
    config = GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence", beta=0.04)
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend=backend)
    ref_out, ref_grads = run_loss(reference.fused_linear_grpo_loss, as_float64(problem), config)
    assert_output_matches(out, grads, ref_out, ref_grads, torch.float32)


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
def test_tied_weights_accumulate_both_uses(backend):
    """An LM head tied to the embeddings gets the gradient of both uses."""
    torch.manual_seed(0)
    V, H = 50, 16
    device = device_of(backend)
    ids = torch.randint(0, V, (2, 6))
    problem = make_problem(seed=5, B=2, T=5, H=H, V=V, with_bias=False)
    embedding = torch.randn(V, H, dtype=torch.float64).requires_grad_()
    grads = {}
    for name, bk, dev in (("fused", backend, device), ("reference", "reference", "cpu")):
        emb = embedding.detach().clone().float().to(dev).requires_grad_() if name == "fused" else embedding
        hidden = torch.tanh(torch.nn.functional.embedding(ids[:, :5].to(dev), emb))
        out = fused_linear_grpo_loss(hidden, emb, ids[:, 1:].to(dev), problem.completion_mask.to(dev),
                                     problem.advantages.to(dev, emb.dtype), old_logps=problem.old_logps.to(dev),
                                     backend=bk)
        out.loss.backward()
        grads[name] = emb.grad.cpu()
    torch.testing.assert_close(grads["fused"].double(), grads["reference"], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", FUSED_BACKENDS)
@pytest.mark.parametrize("config_name", ["dapo_beta_kl", "grpo_seq_gspo", "entropy_bonus", "temperature"])
def test_loss_from_logits_matches_float64_reference(backend, config_name, dtype):
    gen = torch.Generator().manual_seed(4)
    B, T, V = 3, 6, 133
    full_logits = (3.0 * torch.randn(B, T + 1, V, generator=gen, dtype=torch.float64)).to(dtype)
    problem = make_problem(seed=4, B=B, T=T, V=V)
    config = _config(config_name)
    results = []
    runs = ((backend, full_logits.clone(), device_of(backend)), ("reference", full_logits.double(), "cpu"))
    for bk, logits, dev in runs:
        logits = logits.to(dev).requires_grad_()
        # the [:, :-1] slice is strided: the fused paths must read it in place
        out = grpo_loss_from_logits(logits[:, :-1], problem.completion_ids.to(dev), problem.completion_mask.to(dev),
                                    problem.advantages.to(dev), old_logps=problem.old_logps.to(dev),
                                    ref_logps=problem.ref_logps.to(dev), config=config, backend=bk)
        out.loss.backward()
        results.append((out, logits.grad.cpu()))
    (out, grad), (ref_out, ref_grad) = results
    assert_loss_close(out.loss, ref_out.loss, dtype)
    for name, value in ref_out.metrics.items():
        assert_loss_close(out.metrics[name], value, dtype, what=name)
    assert_grad_close(grad, ref_grad, dtype, "dlogits")
    assert float(grad[:, -1].abs().max()) == 0.0


def test_token_level_triton_fuses_the_objective_in_the_epilogue(monkeypatch):
    """Token-level configs never go through the separate log-prob op on the Triton path; sequence-level do."""
    from grpo_kernels import ops
    from grpo_kernels.objective import is_token_level

    calls = []
    original = ops.linear_logprobs
    monkeypatch.setattr(ops, "linear_logprobs", lambda *a, **k: calls.append(1) or original(*a, **k))
    problem = make_problem(seed=0, device=device_of("triton"))
    for config, fused in ((GRPOLossConfig(beta=0.04, loss_type="sapo"), True),
                          (loss_config(importance_sampling_level="sequence"), False),
                          (GRPOLossConfig(top_entropy_quantile=0.5), False)):
        assert is_token_level(config) is fused
        calls.clear()
        run_loss(fused_linear_grpo_loss, problem, config, backend="triton")
        assert bool(calls) is not fused
