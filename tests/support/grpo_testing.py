"""Random GRPO problems and float64 comparisons shared by the tests.

Tolerances, per input dtype (errors are measured against the float64 reference run on the same
inputs rounded to that dtype):
- loss and metrics: |actual - expected| <= LOSS_TOL * max(1, |expected|)
- gradients: max |actual - expected| <= GRAD_TOL * max |expected| + GRAD_ATOL (the gradients of 16-bit
  inputs are themselves rounded to 16 bits, which alone costs up to 2^-8 of the largest element for
  bfloat16; GRAD_ATOL covers gradients that nearly cancel, e.g. 1 - p for a token with p ~ 1, where
  float32 logits of magnitude ~30 leave an absolute error of ~1e-6 times |W|)
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import pytest
import torch

from grpo_kernels import GRPOLossConfig
from grpo_kernels.backends import BACKENDS, BackendSpec
from grpo_kernels.config import LossConfigWarning
from grpo_kernels.losses import DEFAULT_LOSS_TYPE, get_loss_type

LOSS_TOL = {torch.float64: 1e-9, torch.float32: 1e-5, torch.bfloat16: 1e-4, torch.float16: 1e-4}
GRAD_TOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 1.5e-2, torch.float16: 3e-3}
GRAD_ATOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-4, torch.float16: 1e-4}


@dataclass
class Problem:
    hidden: torch.Tensor
    weight: torch.Tensor
    bias: Optional[torch.Tensor]
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    advantages: torch.Tensor
    old_logps: Optional[torch.Tensor]
    ref_logps: Optional[torch.Tensor]
    importance_ratio: Optional[torch.Tensor]

    def to(self, device: str) -> "Problem":
        return Problem(**{name: None if getattr(self, name) is None else getattr(self, name).to(device)
                          for name in TENSOR_FIELDS})

    def loss_kwargs(self) -> dict:
        return dict(bias=self.bias, old_logps=self.old_logps, ref_logps=self.ref_logps,
                    importance_ratio=self.importance_ratio)


TENSOR_FIELDS = ("hidden", "weight", "bias", "completion_ids", "completion_mask", "advantages", "old_logps",
                 "ref_logps", "importance_ratio")


def departs_from_paper(**kwargs: Any) -> bool:
    """Whether GRPOLossConfig(**kwargs) is a combination TRL warns about (and so do we: LossConfigWarning)."""
    loss = get_loss_type(kwargs.get("loss_type", DEFAULT_LOSS_TYPE))
    level = kwargs.get("importance_sampling_level", "token")
    return (loss.paper_importance_sampling_level not in (None, level)
            or (level == "sequence" and loss.warns_sequence_level))


@contextlib.contextmanager
def config_warning_expected(**kwargs: Any) -> Iterator[None]:
    """A context asserting the LossConfigWarning of such a combination (built inside it, e.g. by a patched trainer),
    and that no other combination warns."""
    if departs_from_paper(**kwargs):
        with pytest.warns(LossConfigWarning):
            yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error", LossConfigWarning)
        yield


def loss_config(**kwargs: Any) -> GRPOLossConfig:
    """GRPOLossConfig(**kwargs), asserting the LossConfigWarning of a combination TRL warns about, and that no other
    combination warns: a test that builds such a config states that it expects the warning."""
    with config_warning_expected(**kwargs):
        return GRPOLossConfig(**kwargs)


def make_problem(seed: int, B: int = 3, T: int = 5, H: int = 37, V: int = 150, dtype: torch.dtype = torch.float32,
                 logit_scale: float = 3.0, with_bias: bool = True, with_old: bool = True, with_ref: bool = True,
                 importance_ratio: Optional[str] = None, masked_rows: int = 0, token_advantages: bool = False,
                 device: str = "cpu") -> Problem:
    """Hidden states and an LM head whose logits have std ~logit_scale; completion tokens sampled from the
    policy itself (as in real rollouts); old/ref log-probs near the policy's so ratios straddle the clip."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=gen, dtype=torch.float64)
    weight = torch.randn(V, H, generator=gen, dtype=torch.float64) * (logit_scale / H ** 0.5)
    bias = torch.randn(V, generator=gen, dtype=torch.float64) * 0.5 if with_bias else None
    logits = hidden @ weight.T + (bias if bias is not None else 0.0)
    completion_ids = torch.multinomial(torch.softmax(logits.reshape(-1, V), -1), 1, generator=gen).view(B, T)
    logps = torch.log_softmax(logits, -1).gather(-1, completion_ids[..., None]).squeeze(-1)
    mask = (torch.rand(B, T, generator=gen) > 0.25).to(torch.int64)
    mask[:, 0] = 1
    if masked_rows:
        mask[:masked_rows] = 0
    advantages = torch.randn((B, T) if token_advantages else (B,), generator=gen, dtype=torch.float64)
    # log-probabilities still (at most 0: the library warns about larger ones, validation.LOG_PROB_SLACK)
    old = (logps + 0.15 * torch.randn(B, T, generator=gen, dtype=torch.float64)).clamp(max=0).float() \
        if with_old else None
    ref = (logps + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64)).clamp(max=0).float() \
        if with_ref else None
    rho = None
    if importance_ratio is not None:
        shape = (B, T) if importance_ratio == "token" else (B, 1)
        rho = (0.5 + torch.rand(shape, generator=gen, dtype=torch.float64)).float()
    to = dict(device=device)
    return Problem(
        hidden=hidden.to(dtype).to(**to), weight=weight.to(dtype).to(**to),
        bias=None if bias is None else bias.to(dtype).to(**to),
        completion_ids=completion_ids.to(**to), completion_mask=mask.to(**to), advantages=advantages.float().to(**to),
        old_logps=None if old is None else old.to(**to), ref_logps=None if ref is None else ref.to(**to),
        importance_ratio=None if rho is None else rho.to(**to),
    )


def as_float64(problem: Problem) -> Problem:
    """The same inputs, exactly, in float64 on the CPU (for the reference)."""
    def cast(x):
        if x is None:
            return None
        x = x.detach().cpu()
        return x.double() if x.dtype.is_floating_point else x
    return Problem(**{k: cast(getattr(problem, k)) for k in TENSOR_FIELDS})


def run_loss(fn, problem: Problem, config, **kwargs):
    """Run a loss entry point with fresh leaf copies; return (output, grads dict)."""
    leaves = {name: getattr(problem, name).detach().clone().requires_grad_()
              for name in ("hidden", "weight", "bias") if getattr(problem, name) is not None}
    kw = problem.loss_kwargs()
    kw["bias"] = leaves.get("bias")
    out = fn(leaves["hidden"], leaves["weight"], problem.completion_ids, problem.completion_mask, problem.advantages,
             config=config, **kw, **kwargs)
    out.loss.backward()
    return out, {name: leaf.grad for name, leaf in leaves.items()}


def assert_loss_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str = "loss") -> None:
    a, e = float(actual.detach()), float(expected.detach())
    tol = LOSS_TOL[dtype] * max(1.0, abs(e))
    assert abs(a - e) <= tol, f"{what}: {a!r} vs float64 reference {e!r} (|diff| {abs(a - e):.3g} > {tol:.3g})"


def assert_grad_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str,
                      atol: Optional[float] = None) -> None:
    """Within GRAD_TOL of the largest expected element plus `atol` (default GRAD_ATOL of the dtype)."""
    atol = GRAD_ATOL[dtype] if atol is None else atol
    assert actual is not None, f"{what}: no gradient"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} vs {tuple(expected.shape)}"
    assert actual.dtype == dtype, f"{what}: gradient dtype {actual.dtype}, expected {dtype}"
    err = float((actual.detach().cpu().double() - expected.detach().cpu().double()).abs().max())
    scale = float(expected.abs().max())
    assert err <= GRAD_TOL[dtype] * scale + atol, (
        f"{what}: max error {err:.3g} > {GRAD_TOL[dtype]:g} x max|grad| {scale:.3g} + {atol:g}")


def assert_output_matches(out, grads, ref_out, ref_grads, dtype: torch.dtype, grad_atol: Optional[float] = None
                          ) -> None:
    """Loss, metrics, log-probs and gradients within the dtype's tolerances (the gradients' absolute one
    `grad_atol` where given); compared on the CPU, wherever each side was computed."""
    assert_loss_close(out.loss, ref_out.loss, dtype)
    assert set(out.metrics) == set(ref_out.metrics), f"metric names {sorted(out.metrics)} vs {sorted(ref_out.metrics)}"
    for name, value in ref_out.metrics.items():
        assert_loss_close(out.metrics[name], value, dtype, what=f"metric {name}")
    assert out.logps.dtype == torch.float32 and out.logps.shape == ref_out.logps.shape
    torch.testing.assert_close(out.logps.cpu().double(), ref_out.logps.cpu().double(),
                               atol=LOSS_TOL[dtype] * 10, rtol=LOSS_TOL[dtype] * 10)
    for name, expected in ref_grads.items():
        assert_grad_close(grads[name], expected, dtype, f"d{name}", grad_atol)


def triton_device() -> str:
    """Triton runs compiled on a CUDA machine and under the interpreter on a CPU-only one."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def runs_triton(backend: str) -> bool:
    return backend in BACKENDS and BACKENDS[backend].triton_kernels


def device_of(backend: str) -> str:
    return triton_device() if runs_triton(backend) else "cpu"


def registered_backends(**declared: Any) -> list[str]:
    """The backends registered when the tests are collected (one a plugin or conftest registers included), in the
    registry's order, those whose entries declare `declared` (e.g. torch_compile=True): a test parametrized by this
    runs on every backend that declares what it checks, without naming any."""
    unknown = [flag for flag in declared if flag not in BackendSpec.__dataclass_fields__]
    if unknown:
        raise ValueError(f"BackendSpec has no field {unknown}")
    return [name for name, spec in BACKENDS.items() if all(getattr(spec, flag) == value
                                                          for flag, value in declared.items())]


# The streaming backends (those that never form the [tokens, vocab] logits).
FUSED_BACKENDS = registered_backends(materializes_logits=False)

# Tests that run Triton on CPU tensors, which needs the interpreter: skipped on a machine with CUDA (conftest.py).
INTERPRETER = pytest.mark.interpreter


def with_triton_interpreted(backends: list[str]) -> list:
    """`backends` as parametrize values, those running Triton marked `interpreter`: for a test that keeps its tensors
    on the CPU whatever the machine (one that follows `device_of(backend)` runs Triton on the GPU there instead)."""
    return [pytest.param(backend, marks=INTERPRETER) if runs_triton(backend) else backend for backend in backends]

def kept_sets(targets: torch.Tensor, vocab: int, size: int, seed: int, without_set: float = 0.2,
              padding: float = 0.3) -> torch.Tensor:
    """[*targets.shape, size] kept-token sets as a truncating sampler records them: each holds its target and
    distinct other ids, some padded with -1 at the end, and a fraction of positions carry no set (all -1)."""
    gen = torch.Generator().manual_seed(seed)
    flat = targets.reshape(-1).cpu()
    sets = torch.full((flat.numel(), size), -1, dtype=torch.int64)
    for row, target in enumerate(flat.tolist()):
        if torch.rand((), generator=gen) < without_set:
            continue
        length = size if torch.rand((), generator=gen) >= padding else int(torch.randint(1, size + 1, (),
                                                                                          generator=gen))
        others = [v for v in torch.randperm(vocab, generator=gen).tolist() if v != target][:length - 1]
        ids = torch.tensor([target, *others])
        sets[row, :length] = ids[torch.randperm(length, generator=gen)]
    return sets.view(*targets.shape, size).to(targets.device)
