"""The Triton launchers allocate O(tokens), O(tokens x H) and O(V x H) buffers only, never [tokens, vocab]:
the kernels themselves cannot allocate, so this is the whole memory footprint of the Triton path."""

import pytest
import torch
from grpo_testing import device_of, loss_config, make_problem, run_loss

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss


class _RecordingTorch:
    """Stands in for the `torch` module inside a launcher module and records every buffer it allocates."""

    def __init__(self, sizes: list):
        self._sizes = sizes

    def __getattr__(self, name):
        attr = getattr(torch, name)
        if name in ("empty", "zeros", "empty_like", "zeros_like", "full", "ones"):
            def allocate(*args, **kwargs):
                out = attr(*args, **kwargs)
                self._sizes.append(out.numel())
                return out
            return allocate
        return attr


@pytest.mark.parametrize("config", [GRPOLossConfig(beta=0.04), loss_config(importance_sampling_level="sequence",
                                                                              entropy_coef=0.1)],
                         ids=["epilogue", "logprobs_then_objective"])
def test_no_tokens_by_vocab_buffer(monkeypatch, config):
    from grpo_kernels.kernels import linear_backward, linear_forward
    from grpo_kernels.kernels.configs import INTERPRETER_CONFIGS

    sizes: list = []
    for module in (linear_forward, linear_backward):
        monkeypatch.setattr(module, "torch", _RecordingTorch(sizes))
    B, T, H, V = 2, 24, 8, 500
    problem = make_problem(seed=0, B=B, T=T, H=H, V=V, device=device_of("triton"))
    run_loss(fused_linear_grpo_loss, problem, config, backend="triton")
    assert sizes, "the launchers were not called"
    N = B * T
    block_k = max(INTERPRETER_CONFIGS[name].block_k for name in ("forward", "grad_hidden", "grad_weight"))
    padded_h = -(-H // block_k) * block_k  # H is padded to the K block (kernels/launch.py)
    assert max(sizes) <= max(V * padded_h, N * padded_h, N), \
        f"largest launcher buffer {max(sizes)} elements (N*V = {N * V})"
