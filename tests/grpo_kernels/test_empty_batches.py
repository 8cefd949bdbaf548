"""Empty batches (B = 0, T = 0, packed N = 0) on every registered backend: each returns what the reference returns
(a zero loss, the same metrics, empty log-probs and zero gradients of the inputs' shapes), for every loss type
and the options that read the batch as a whole (a KL, the top-entropy quantile, sequence-level ratios)."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, linear_logprobs
from grpo_kernels.backends import backend_names
from grpo_kernels.losses import loss_type_names
from grpo_testing import device_of, with_triton_interpreted

V, H = 7, 4
pytestmark = pytest.mark.filterwarnings("ignore::grpo_kernels.config.LossConfigWarning")
PADDED_SHAPES = [(0, 3), (2, 0), (0, 0)]
PACKED_SEQUENCES = [[0, 0], [0, 0, 0]]  # N = 0 tokens in one and in two (empty) sequences
OPTIONS = [{}, {"beta": 0.04}, {"top_entropy_quantile": 0.5}, {"importance_sampling_level": "sequence"},
           {"entropy_coef": 0.01, "beta": 0.04, "top_entropy_quantile": 0.2}]


def _inputs(shape: tuple[int, ...], device: str, packed_sequences: int = 0) -> dict:
    generator = torch.Generator().manual_seed(0)
    advantages = packed_sequences if packed_sequences else shape[0]
    return {"hidden": torch.randn(*shape, H, generator=generator).to(device).requires_grad_(),
            "weight": torch.randn(V, H, generator=generator).to(device).requires_grad_(),
            "completion_ids": torch.zeros(shape, dtype=torch.long, device=device),
            "completion_mask": torch.ones(shape, device=device),
            "advantages": torch.randn(advantages, generator=generator).to(device),
            "old_logps": torch.zeros(shape, device=device), "ref_logps": torch.zeros(shape, device=device)}


def _run(backend: str, inputs: dict, config: GRPOLossConfig, cu_seqlens=None) -> dict:
    out = fused_linear_grpo_loss(**inputs, config=config, backend=backend, cu_seqlens=cu_seqlens)
    out.loss.backward()
    result = {"loss": out.loss.item(), "logps": tuple(out.logps.shape),
              "metrics": {name: float(value) for name, value in out.metrics.items()},
              "grad_hidden": inputs["hidden"].grad, "grad_weight": inputs["weight"].grad}
    inputs["hidden"].grad = inputs["weight"].grad = None
    return result


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _check_like_reference(backend: str, result: dict, expected: dict, shape: tuple[int, ...], case: str) -> None:
    assert result["loss"] == expected["loss"] == 0.0, case
    assert result["logps"] == expected["logps"] == shape, case
    assert result["metrics"].keys() == expected["metrics"].keys(), case
    assert all(_same(result["metrics"][k], expected["metrics"][k]) for k in expected["metrics"]), (
        case, result["metrics"], expected["metrics"])
    grad_hidden, grad_weight = result["grad_hidden"], result["grad_weight"]
    assert grad_hidden is None or (tuple(grad_hidden.shape) == (*shape, H) and not grad_hidden.any()), case
    assert grad_weight is None or (tuple(grad_weight.shape) == (V, H) and not grad_weight.any()), case


@pytest.mark.parametrize("backend", with_triton_interpreted(list(backend_names())))
def test_an_empty_batch_returns_what_the_reference_returns_on_every_backend(backend):
    device = device_of(backend)
    for loss_type in loss_type_names():
        for options in OPTIONS:
            config = GRPOLossConfig(loss_type=loss_type, **options)
            for shape in PADDED_SHAPES:
                case = f"{backend} {loss_type} {options} B, T = {shape}"
                expected = _run("reference", _inputs(shape, "cpu"), config)
                _check_like_reference(backend, _run(backend, _inputs(shape, device), config), expected, shape, case)
            for bounds in PACKED_SEQUENCES:
                case = f"{backend} {loss_type} {options} packed N = 0, cu_seqlens {bounds}"
                cu = torch.tensor(bounds, dtype=torch.int32)
                expected = _run("reference", _inputs((0,), "cpu", len(bounds) - 1), config, cu)
                result = _run(backend, _inputs((0,), device, len(bounds) - 1), config, cu.to(device))
                _check_like_reference(backend, result, expected, (0,), case)


@pytest.mark.parametrize("backend", with_triton_interpreted(list(backend_names())))
@pytest.mark.parametrize("shape", PADDED_SHAPES + [(0,)])
def test_log_probs_of_an_empty_batch_are_empty_on_every_backend(backend, shape):
    device = device_of(backend)
    hidden = torch.randn(*shape, H, device=device, requires_grad=True)
    weight = torch.randn(V, H, device=device, requires_grad=True)
    targets = torch.zeros(shape, dtype=torch.long, device=device)
    logps, entropy = linear_logprobs(hidden, weight, targets, backend=backend, return_entropy=True,
                                     mask=torch.ones(shape, device=device))
    assert tuple(logps.shape) == tuple(entropy.shape) == shape
    (logps.sum() + entropy.sum()).backward()
    assert tuple(hidden.grad.shape) == (*shape, H) and not hidden.grad.any()
    assert weight.grad is None or not weight.grad.any()
