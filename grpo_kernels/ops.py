"""Autograd glue: the streaming log-prob passes as torch custom ops with their backward.

Registered through `torch.library.custom_op`, so `torch.compile` sees two opaque ops with known
output shapes instead of breaking the graph on a Triton launch or a Python loop. The kernels and the
chunked torch code know nothing of autograd; this file wires them to it.
"""

from __future__ import annotations

from types import ModuleType
from typing import Optional

import torch

from . import torch_chunked


def _implementation(backend: str) -> ModuleType:
    if backend == "torch":
        return torch_chunked
    if backend == "triton":
        from .kernels import launch  # builds no kernel until called: CPU tensors get the interpreter first

        return launch
    raise ValueError(f"backend must be 'torch' or 'triton' here, got {backend!r}")


def _stats_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---- hidden states x LM head -> per-token log-probs ------------------------------------------------

@torch.library.custom_op("grpo_kernels::linear_logprobs", mutates_args=())
def _linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                     targets: torch.Tensor, temperature: float, backend: str
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _implementation(backend).linear_forward(hidden, weight, bias, targets, temperature)


@_linear_logprobs.register_fake
def _(hidden, weight, bias, targets, temperature, backend):
    stats = hidden.new_empty(hidden.shape[0], dtype=_stats_dtype(hidden.dtype))
    return stats, torch.empty_like(stats), torch.empty_like(stats)


@torch.library.custom_op("grpo_kernels::linear_logprobs_backward", mutates_args=())
def _linear_logprobs_backward(grad_logps: torch.Tensor, grad_entropy: Optional[torch.Tensor],
                              hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                              targets: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor,
                              temperature: float, backend: str
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    grad_hidden, grad_weight, grad_bias = _implementation(backend).linear_backward(
        grad_logps, grad_entropy, hidden, weight, bias, targets, lse, entropy, temperature)
    # A custom op cannot return None: an empty tensor stands for "no bias".
    return grad_hidden, grad_weight, grad_bias if grad_bias is not None else hidden.new_empty(0)


@_linear_logprobs_backward.register_fake
def _(grad_logps, grad_entropy, hidden, weight, bias, targets, lse, entropy, temperature, backend):
    grad_bias = torch.empty_like(bias) if bias is not None else hidden.new_empty(0)
    return torch.empty_like(hidden), torch.empty_like(weight), grad_bias


def _linear_setup_context(ctx, inputs, output) -> None:
    hidden, weight, bias, targets, temperature, backend = inputs
    _, entropy, lse = output
    ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
    ctx.temperature, ctx.backend, ctx.has_bias = temperature, backend, bias is not None


def _linear_backward(ctx, grad_logps, grad_entropy, _grad_lse):
    hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
    grad_logps = torch.zeros_like(lse) if grad_logps is None else grad_logps.contiguous()
    grad_hidden, grad_weight, grad_bias = _linear_logprobs_backward(
        grad_logps, None if grad_entropy is None else grad_entropy.contiguous(), hidden, weight, bias, targets,
        lse, entropy, ctx.temperature, ctx.backend)
    return grad_hidden, grad_weight, grad_bias if ctx.has_bias else None, None, None, None


_linear_logprobs.register_autograd(_linear_backward, setup_context=_linear_setup_context)


# ---- logits -> per-token log-probs ------------------------------------------------------------------

@torch.library.custom_op("grpo_kernels::logits_logprobs", mutates_args=())
def _logits_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, backend: str
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _implementation(backend).logits_forward(logits, targets, temperature)


@_logits_logprobs.register_fake
def _(logits, targets, temperature, backend):
    stats = logits.new_empty(logits.shape[:2], dtype=_stats_dtype(logits.dtype))
    return stats, torch.empty_like(stats), torch.empty_like(stats)


@torch.library.custom_op("grpo_kernels::logits_logprobs_backward", mutates_args=())
def _logits_logprobs_backward(grad_logps: torch.Tensor, grad_entropy: Optional[torch.Tensor],
                              logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
                              entropy: torch.Tensor, temperature: float, backend: str) -> torch.Tensor:
    return _implementation(backend).logits_backward(grad_logps, grad_entropy, logits, targets, lse, entropy,
                                                    temperature)


@_logits_logprobs_backward.register_fake
def _(grad_logps, grad_entropy, logits, targets, lse, entropy, temperature, backend):
    return torch.empty_like(logits)


def _logits_setup_context(ctx, inputs, output) -> None:
    logits, targets, temperature, backend = inputs
    _, entropy, lse = output
    ctx.save_for_backward(logits, targets, lse, entropy)
    ctx.temperature, ctx.backend = temperature, backend


def _logits_backward(ctx, grad_logps, grad_entropy, _grad_lse):
    logits, targets, lse, entropy = ctx.saved_tensors
    grad_logps = torch.zeros_like(lse) if grad_logps is None else grad_logps.contiguous()
    grad_logits = _logits_logprobs_backward(
        grad_logps, None if grad_entropy is None else grad_entropy.contiguous(), logits, targets, lse, entropy,
        ctx.temperature, ctx.backend)
    return grad_logits, None, None, None


_logits_logprobs.register_autograd(_logits_backward, setup_context=_logits_setup_context)


# ---- hidden states x LM head -> token-level GRPO loss terms (objective fused in the Triton epilogue) ---

@torch.library.custom_op("grpo_kernels::linear_grpo_token_terms", mutates_args=())
def _linear_grpo_token_terms(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                             targets: torch.Tensor, advantages: torch.Tensor, token_weights: torch.Tensor,
                             entropy_weights: Optional[torch.Tensor], old_logps: Optional[torch.Tensor],
                             ref_logps: Optional[torch.Tensor], importance_ratio: Optional[torch.Tensor],
                             mask: torch.Tensor, temperature: float, loss_kind: int, eps_low: float, eps_high: float,
                             delta: Optional[float], beta: float, sapo_pos: float, sapo_neg: float,
                             bias_correction: bool
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                        torch.Tensor, torch.Tensor]:
    from .kernels import launch

    objective = dict(loss_kind=loss_kind, eps_low=eps_low, eps_high=eps_high, delta=delta, beta=beta,
                     sapo_pos=sapo_pos, sapo_neg=sapo_neg, bias_correction=bias_correction)
    return launch.linear_grpo_forward(hidden, weight, bias, targets, advantages, token_weights, entropy_weights,
                                      old_logps, ref_logps, importance_ratio, mask, temperature, objective)


@_linear_grpo_token_terms.register_fake
def _(hidden, weight, bias, targets, advantages, token_weights, entropy_weights, old_logps, ref_logps,
      importance_ratio, mask, temperature, *scalars):
    per_token = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
    return (*(torch.empty_like(per_token) for _ in range(6)), hidden.new_empty(hidden.shape[0], dtype=torch.int8))


def _token_terms_setup_context(ctx, inputs, output) -> None:
    hidden, weight, bias, targets, _, _, entropy_weights, *_ = inputs
    temperature = inputs[11]
    _, _, entropy, lse, grad, _, _ = output
    ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy, grad, entropy_weights)
    ctx.temperature, ctx.has_bias = temperature, bias is not None


def _token_terms_backward(ctx, grad_terms, *_unused):
    hidden, weight, bias, targets, lse, entropy, grad, entropy_weights = ctx.saved_tensors
    # each term depends on its own token only: dLoss/dlp = upstream * g, dLoss/dent = -upstream * entropy weight
    grad_logps = grad * grad_terms
    grad_entropy = None if entropy_weights is None else -entropy_weights * grad_terms
    grad_hidden, grad_weight, grad_bias = _linear_logprobs_backward(
        grad_logps.contiguous(), None if grad_entropy is None else grad_entropy.contiguous(), hidden, weight, bias,
        targets, lse, entropy, ctx.temperature, "triton")
    return (grad_hidden, grad_weight, grad_bias if ctx.has_bias else None) + (None,) * 17


_linear_grpo_token_terms.register_autograd(_token_terms_backward, setup_context=_token_terms_setup_context)


# ---- entry points for api.py --------------------------------------------------------------------------

def linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], targets: torch.Tensor,
                    temperature: float, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [N, H], weight [V, H], targets [N] -> (logps [N], entropy [N]), differentiable."""
    logps, entropy, _ = _linear_logprobs(hidden.contiguous(), weight.contiguous(),
                                         None if bias is None else bias.contiguous(), targets.contiguous(),
                                         float(temperature), backend)
    return logps, entropy


def logits_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                    backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, T, V] (rows may be strided, e.g. logits[:, :-1]), targets [B, T] -> (logps, entropy) [B, T]."""
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    logps, entropy, _ = _logits_logprobs(logits, targets.contiguous(), float(temperature), backend)
    return logps, entropy


def linear_grpo_token_terms(hidden, weight, bias, targets, advantages, token_weights, entropy_weights, old_logps,
                            ref_logps, importance_ratio, mask, temperature, loss_kind, config):
    """Flattened [N] inputs -> (terms, logps, entropy, kl, clip code); terms.sum() is the loss."""
    def flat(x):
        return None if x is None else x.reshape(-1).float().contiguous()

    terms, logps, entropy, _, _, kl, clip = _linear_grpo_token_terms(
        hidden.contiguous(), weight.contiguous(), None if bias is None else bias.contiguous(), targets.contiguous(),
        flat(advantages), flat(token_weights), flat(entropy_weights), flat(old_logps), flat(ref_logps),
        flat(importance_ratio), flat(mask), float(temperature), loss_kind, config.epsilon_low,
        config.epsilon_high_value, None if config.delta is None else float(config.delta), float(config.beta),
        float(config.sapo_temperature_pos), float(config.sapo_temperature_neg), bool(config.use_bias_correction_kl))
    return terms, logps, entropy, kl, clip
