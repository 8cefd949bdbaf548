"""Kinds of input the red-team round of issue 37 found past the checks, each covered as a kind, on every
backend: a tensor argument that is not dense memory (sparse, nested), a hidden size of 0, a mask of
`linear_logprobs` holding values other than 0/1, a temperature that is not a number, a workspace past int64, and
loss-type names outside ASCII. Each is one ValueError/TypeError naming the argument, raised before any kernel."""

from __future__ import annotations

import pytest
import torch

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, linear_logprobs, register_loss_type
from grpo_kernels.config import MIN_TEMPERATURE
from grpo_kernels.losses import get_loss_type
from grpo_testing import registered_backends, with_triton_interpreted

BACKENDS = with_triton_interpreted([b for b in registered_backends() if b in ("reference", "torch", "triton")])
B, T, H, V = 2, 3, 8, 11


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"hidden": torch.randn(B, T, H, generator=g), "weight": torch.randn(V, H, generator=g),
            "completion_ids": torch.randint(0, V, (B, T), generator=g), "completion_mask": torch.ones(B, T),
            "advantages": torch.randn(B, generator=g), "old_logps": -torch.rand(B, T, generator=g),
            "ref_logps": -torch.rand(B, T, generator=g)}


def _loss(backend: str, **inputs):
    return fused_linear_grpo_loss(inputs.pop("hidden"), inputs.pop("weight"), inputs.pop("completion_ids"),
                                  inputs.pop("completion_mask"), inputs.pop("advantages"), backend=backend, **inputs)


NOT_DENSE = {
    "sparse_coo": lambda x: x.to_sparse(),
    "sparse_csr": lambda x: x.to_sparse_csr() if x.dim() == 2 else x.to_sparse(),
}


# torch's own notice when the test builds a CSR tensor, not a warning of this library's
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state:UserWarning")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("argument", sorted(_inputs()))
@pytest.mark.parametrize("layout", sorted(NOT_DENSE))
def test_every_tensor_argument_that_is_not_dense_is_named(backend, argument, layout):
    inputs = _inputs()
    inputs[argument] = NOT_DENSE[layout](inputs[argument])
    with pytest.raises(TypeError, match=f"{argument} must be a dense \\(strided\\) tensor, got a sparse"):
        _loss(backend, **inputs)


# torch's own notice when the test builds a nested tensor
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage:UserWarning")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nested_hidden_is_named(backend):
    inputs = _inputs()
    inputs["hidden"] = torch.nested.nested_tensor([torch.randn(T, H), torch.randn(T + 1, H)])
    with pytest.raises(TypeError, match="hidden must be a dense \\(strided\\) tensor, got a nested one"):
        _loss(backend, **inputs)
    with pytest.raises(TypeError, match="hidden must be a dense"):
        linear_logprobs(inputs["hidden"], inputs["weight"], inputs["completion_ids"], backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hidden_size_of_zero_is_named(backend):
    inputs = _inputs()
    inputs["hidden"], inputs["weight"] = torch.randn(B, T, 0), torch.randn(V, 0)
    with pytest.raises(ValueError, match="hidden size H >= 1, got shape \\[2, 3, 0\\]"):
        _loss(backend, **inputs)
    with pytest.raises(ValueError, match="hidden size H >= 1"):
        linear_logprobs(inputs["hidden"], inputs["weight"], inputs["completion_ids"], backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("value", [2.0, -1.0, 0.5, float("nan"), float("inf")])
def test_a_linear_logprobs_mask_other_than_0_or_1_is_named(backend, value):
    """As fused_linear_grpo_loss's completion_mask: a 2 was read as 1 and a NaN made every log-prob NaN."""
    inputs = _inputs()
    mask = torch.ones(B, T)
    mask[1, 2] = value
    with pytest.raises(ValueError, match="mask values must be 0 or 1"):
        linear_logprobs(inputs["hidden"], inputs["weight"], inputs["completion_ids"], mask=mask, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", [True, "1", torch.tensor(2.0), None, 0, -1.0, float("nan"), float("inf")])
def test_a_temperature_that_is_not_a_positive_finite_number_is_named(backend, temperature):
    inputs = _inputs()
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        linear_logprobs(inputs["hidden"], inputs["weight"], inputs["completion_ids"], temperature=temperature,
                        backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("workspace", [2**63, 10**30, 0, -1, True, 1.5])
def test_a_workspace_outside_1_to_int64_is_named(backend, workspace):
    inputs = _inputs()
    with pytest.raises(ValueError, match="workspace_bytes must be a positive int"):
        linear_logprobs(inputs["hidden"], inputs["weight"], inputs["completion_ids"], workspace_bytes=workspace,
                        backend=backend)


@pytest.mark.parametrize("name", ["ＧＲＰＯ", "\u0261rpo", "ﬀ", "grpo\u200b", "dapo\u0301", "loss_ü"])
def test_a_loss_type_name_outside_ascii_is_refused(name):
    """Unicode letters that look like or fold to ASCII ones would register 'grpo' twice under one reading."""
    grpo = get_loss_type("grpo")
    with pytest.raises(ValueError, match="name must be an ASCII identifier"):
        register_loss_type(name, grpo.term, grpo.aggregation)


# The Triton interpreter evaluates a tile's masked-out lanes too (numpy, on the padding's stand-in values), where
# logits / T overflow and are then discarded: the values asserted below are all finite.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", [MIN_TEMPERATURE, 1e-12, 1e-6])
def test_a_temperature_down_to_the_bound_gives_finite_values_and_below_it_is_refused(backend, temperature):
    """At 1e-40 (float32 has no room for logits / T) every backend's log-probs were NaN, triton's loss finite
    beside them; from the bound up every value is finite, below it the config is refused."""
    inputs = _inputs()
    inputs["hidden"].requires_grad_()
    out = _loss(backend, **inputs, config=GRPOLossConfig(temperature=temperature))
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(out.logps).all()
    assert torch.isfinite(inputs["hidden"].grad).all()
    for below in (MIN_TEMPERATURE / 10, 1e-40, 1e-300):
        with pytest.raises(ValueError, match=r"temperature must be in \[1e-30, 1e\+30\]"):
            GRPOLossConfig(temperature=below)
        with pytest.raises(ValueError, match="temperature must be a finite number > 0 \\(at least 1e-30"):
            linear_logprobs(inputs["hidden"], inputs["weight"], inputs["completion_ids"], temperature=below,
                            backend=backend)
