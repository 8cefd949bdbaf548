"""Autograd glue: the streaming log-prob passes as torch custom ops with their backward.

Registered through `torch.library.custom_op`, so `torch.compile` sees two opaque ops with known
output shapes instead of breaking the graph on a Triton launch or a Python loop. The kernels and the
chunked torch code know nothing of autograd; this file wires them to it.
"""

from __future__ import annotations

import functools
import json
import math
import warnings
from dataclasses import asdict
from typing import Optional

import torch

from .backends import DEFAULT_WORKSPACE_BYTES, EPILOGUE, ONE_PASS, get_backend, implementation, stats_dtype
from .backends.one_pass import or_empty, token_step_per_wave
from .config import GRPOLossConfig
from .head import LMHead, LogitTransform
from .objective import TokenInputs
from . import flop_formulas as _flop_formulas
from .second_order import graph_is_kept, refuse_second_order


# ---- the codec of the custom-op boundary --------------------------------------------------------------
# Custom ops take tensors and scalars only. An LMHead crosses as (weight, bias, constants) with constants the
# list [temperature, scale, softcap or NaN]; a GRPOLossConfig as its JSON; TokenInputs as its fields in order.
# Encoded and decoded here and nowhere else.

def encode_head(head: LMHead, detach: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor], list[float]]:
    """(weight, bias, constants), the tensors contiguous (and detached when asked)."""
    if head.shard is not None:
        raise ValueError("a vocabulary-sharded head goes through vocab_parallel, not a custom op")

    def ready(x):
        return None if x is None else (x.detach() if detach else x).contiguous()

    softcap = head.transform.softcap
    return (ready(head.weight), ready(head.bias),
            [float(head.temperature), float(head.transform.scale), math.nan if softcap is None else float(softcap)])


def decode_head(weight: torch.Tensor, bias: Optional[torch.Tensor], constants: list[float]) -> LMHead:
    temperature, scale, softcap = constants
    return LMHead(weight, bias, temperature, LogitTransform(scale, None if math.isnan(softcap) else softcap))


# A config crosses as its class's name and its fields: the class is the caller's own (a GRPOLossConfig subclass adding
# a setting, which a registered loss type's term may read), found again here by name. Rebuilt as the base class, a
# subclass's config failed on the fused routes only ("GRPOLossConfig() got an unexpected keyword argument").
_CONFIG_CLASSES: dict[str, type] = {}


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@torch.compiler.assume_constant_result  # a config is a constant of the graph: torch.compile need not trace JSON
def encode_config(config: GRPOLossConfig) -> str:
    name = _class_name(type(config))
    _CONFIG_CLASSES[name] = type(config)
    return json.dumps({"class": name, "fields": asdict(config)}, sort_keys=True)


@functools.lru_cache(maxsize=64)
def decode_config(key: str) -> GRPOLossConfig:
    encoded = json.loads(key)
    with warnings.catch_warnings():  # the caller's construction already warned
        warnings.simplefilter("ignore")
        return _CONFIG_CLASSES.get(encoded["class"], GRPOLossConfig)(**encoded["fields"])


def encode_inputs(inputs: TokenInputs) -> tuple[Optional[torch.Tensor], ...]:
    return tuple(vars(inputs.ready()).values())


def _implementation(backend: str, workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
                    kept_token_ids: Optional[torch.Tensor] = None):
    return implementation(backend, workspace_bytes, kept_token_ids)


# ---- hidden states x LM head -> per-token log-probs ------------------------------------------------

@torch.library.custom_op("grpo_kernels::linear_logprobs", mutates_args=())
def _linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                     head_constants: list[float], targets: torch.Tensor, backend: str, workspace_bytes: int,
                     kept_token_ids: Optional[torch.Tensor] = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _implementation(backend, workspace_bytes, kept_token_ids).linear_forward(
        hidden, decode_head(weight, bias, head_constants), targets)


@_linear_logprobs.register_fake
def _(hidden, weight, bias, head_constants, targets, backend, workspace_bytes, kept_token_ids=None):
    stats = hidden.new_empty(hidden.shape[0], dtype=stats_dtype(hidden.dtype))
    return stats, torch.empty_like(stats), torch.empty_like(stats)


@torch.library.custom_op("grpo_kernels::linear_logprobs_backward", mutates_args=())
def _linear_logprobs_backward(grad_logps: torch.Tensor, grad_entropy: Optional[torch.Tensor],
                              hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                              head_constants: list[float], targets: torch.Tensor, lse: torch.Tensor,
                              entropy: torch.Tensor, backend: str, workspace_bytes: int, needs_hidden_grad: bool,
                              needs_weight_grad: bool, kept_token_ids: Optional[torch.Tensor] = None
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    grad_hidden, grad_weight, grad_bias = _implementation(backend, workspace_bytes, kept_token_ids).linear_backward(
        grad_logps, grad_entropy, hidden, decode_head(weight, bias, head_constants), targets, lse, entropy,
        needs_hidden_grad=needs_hidden_grad, needs_weight_grad=needs_weight_grad)
    # A custom op cannot return None: an empty tensor stands for "not computed" (no bias, frozen head...).
    return or_empty(grad_hidden, hidden), or_empty(grad_weight, hidden), or_empty(grad_bias, hidden)


def _computed(x: torch.Tensor) -> bool:
    # the "not computed" placeholder is 1-D and empty; every real gradient has its input's shape ([0, H] included)
    return not (x.dim() == 1 and x.numel() == 0)


def _grad_or_none(x: torch.Tensor, needed: bool) -> Optional[torch.Tensor]:
    return x if needed and _computed(x) else None


def _fake_grads(hidden, weight, bias, needs_hidden_grad, needs_weight_grad):
    grad_hidden = torch.empty_like(hidden) if needs_hidden_grad else hidden.new_empty(0)
    grad_weight = torch.empty_like(weight) if needs_weight_grad else hidden.new_empty(0)
    grad_bias = torch.empty_like(bias) if bias is not None and needs_weight_grad else hidden.new_empty(0)
    return grad_hidden, grad_weight, grad_bias


@_linear_logprobs_backward.register_fake
def _(grad_logps, grad_entropy, hidden, weight, bias, head_constants, targets, lse, entropy, backend, workspace_bytes,
      needs_hidden_grad, needs_weight_grad, kept_token_ids=None):
    return _fake_grads(hidden, weight, bias, needs_hidden_grad, needs_weight_grad)


def _linear_setup_context(ctx, inputs, output) -> None:
    hidden, weight, bias, head_constants, targets, backend, workspace_bytes, kept_token_ids = inputs
    _, entropy, lse = output
    ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy, kept_token_ids)
    ctx.head_constants, ctx.backend, ctx.workspace_bytes = head_constants, backend, workspace_bytes
    ctx.weight_shape = tuple(weight.shape)


def _check_weight_unchanged(ctx, weight: torch.Tensor) -> None:
    # The backward recomputes the logits from the weight. A ZeRO-3 partitioned head is numel 0 again by then
    # unless it is re-gathered (grpo_kernels.integrations.sharding.call_with_full_head does that).
    if tuple(weight.shape) != ctx.weight_shape:
        raise RuntimeError(f"the LM-head weight is {list(weight.shape)} in the backward but was "
                           f"{list(ctx.weight_shape)} in the forward; a partitioned (ZeRO-3) head must be gathered "
                           "for the backward too: call the loss through "
                           "grpo_kernels.integrations.sharding.call_with_full_head")


def _linear_backward(ctx, grad_logps, grad_entropy, _grad_lse):
    refuse_second_order(ctx.backend)
    hidden, weight, bias, targets, lse, entropy, kept_token_ids = ctx.saved_tensors
    _check_weight_unchanged(ctx, weight)
    needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
    grad_logps = torch.zeros_like(lse) if grad_logps is None else grad_logps.contiguous()
    grad_hidden, grad_weight, grad_bias = _linear_logprobs_backward(
        grad_logps, None if grad_entropy is None else grad_entropy.contiguous(), hidden, weight, bias,
        ctx.head_constants, targets, lse, entropy, ctx.backend, ctx.workspace_bytes, needs_hidden,
        needs_weight or needs_bias, kept_token_ids)
    return (_grad_or_none(grad_hidden, needs_hidden), _grad_or_none(grad_weight, needs_weight),
            _grad_or_none(grad_bias, needs_bias)) + (None,) * 5


_linear_logprobs.register_autograd(_linear_backward, setup_context=_linear_setup_context)


# ---- logits -> per-token log-probs ------------------------------------------------------------------

@torch.library.custom_op("grpo_kernels::logits_logprobs", mutates_args=())
def _logits_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, backend: str
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return get_backend(backend).logits_backend().logits_forward(logits, targets, temperature)


@_logits_logprobs.register_fake
def _(logits, targets, temperature, backend):
    stats = logits.new_empty(logits.shape[:2], dtype=stats_dtype(logits.dtype))
    return stats, torch.empty_like(stats), torch.empty_like(stats)


@torch.library.custom_op("grpo_kernels::logits_logprobs_backward", mutates_args=())
def _logits_logprobs_backward(grad_logps: torch.Tensor, grad_entropy: Optional[torch.Tensor],
                              logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
                              entropy: torch.Tensor, temperature: float, backend: str) -> torch.Tensor:
    return get_backend(backend).logits_backend().logits_backward(grad_logps, grad_entropy, logits, targets, lse,
                                                                  entropy, temperature)


@_logits_logprobs_backward.register_fake
def _(grad_logps, grad_entropy, logits, targets, lse, entropy, temperature, backend):
    return torch.empty_like(logits)


def _logits_setup_context(ctx, inputs, output) -> None:
    logits, targets, temperature, backend = inputs
    _, entropy, lse = output
    ctx.save_for_backward(logits, targets, lse, entropy)
    ctx.temperature, ctx.backend = temperature, backend


def _logits_backward(ctx, grad_logps, grad_entropy, _grad_lse):
    refuse_second_order(ctx.backend)
    logits, targets, lse, entropy = ctx.saved_tensors
    grad_logps = torch.zeros_like(lse) if grad_logps is None else grad_logps.contiguous()
    grad_logits = _logits_logprobs_backward(
        grad_logps, None if grad_entropy is None else grad_entropy.contiguous(), logits, targets, lse, entropy,
        ctx.temperature, ctx.backend)
    return grad_logits, None, None, None


_logits_logprobs.register_autograd(_logits_backward, setup_context=_logits_setup_context)


# ---- hidden states x LM head -> token-level GRPO loss terms (the EPILOGUE route: objective in the kernel) ---

@torch.library.custom_op("grpo_kernels::linear_grpo_token_terms", mutates_args=())
def _linear_grpo_token_terms(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                             head_constants: list[float], targets: torch.Tensor, mask: torch.Tensor,
                             advantages: torch.Tensor, token_weights: torch.Tensor,
                             entropy_weights: Optional[torch.Tensor], old_logps: Optional[torch.Tensor],
                             ref_logps: Optional[torch.Tensor], importance_ratio: Optional[torch.Tensor], config: str,
                             backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                    torch.Tensor, torch.Tensor, torch.Tensor]:
    from .kernels.token_objective import epilogue_args

    fused = getattr(_implementation(backend), EPILOGUE.method)
    return fused(hidden, decode_head(weight, bias, head_constants), targets, advantages, token_weights,
                 entropy_weights, old_logps, ref_logps, importance_ratio, mask, epilogue_args(decode_config(config)))


@_linear_grpo_token_terms.register_fake
def _(hidden, weight, bias, head_constants, *_):
    per_token = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
    return (*(torch.empty_like(per_token) for _ in range(6)), hidden.new_empty(hidden.shape[0], dtype=torch.int8))


def _token_terms_setup_context(ctx, inputs, output) -> None:
    hidden, weight, bias, head_constants, targets, _, _, _, entropy_weights, *_, backend = inputs
    _, _, entropy, lse, grad, _, _ = output
    ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy, grad, entropy_weights)
    ctx.head_constants, ctx.weight_shape, ctx.backend = head_constants, tuple(weight.shape), backend


def _token_terms_backward(ctx, grad_terms, *_unused):
    refuse_second_order(ctx.backend)
    hidden, weight, bias, targets, lse, entropy, grad, entropy_weights = ctx.saved_tensors
    _check_weight_unchanged(ctx, weight)
    # each term depends on its own token only: dLoss/dlp = upstream * g, dLoss/dent = -upstream * entropy weight
    grad_logps = grad * grad_terms
    grad_entropy = None if entropy_weights is None else -entropy_weights * grad_terms
    needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
    grad_hidden, grad_weight, grad_bias = _linear_logprobs_backward(
        grad_logps.contiguous(), None if grad_entropy is None else grad_entropy.contiguous(), hidden, weight, bias,
        ctx.head_constants, targets, lse, entropy, ctx.backend, DEFAULT_WORKSPACE_BYTES, needs_hidden,
        needs_weight or needs_bias)
    return (_grad_or_none(grad_hidden, needs_hidden), _grad_or_none(grad_weight, needs_weight),
            _grad_or_none(grad_bias, needs_bias)) + (None,) * 11


_linear_grpo_token_terms.register_autograd(_token_terms_backward, setup_context=_token_terms_setup_context)


# ---- hidden states x LM head -> token-level objective with its gradients, in one pass (the ONE_PASS route) -----

@torch.library.custom_op("grpo_kernels::one_pass_token_level", mutates_args=())
def _one_pass_token_level(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                          head_constants: list[float], targets: torch.Tensor, mask: torch.Tensor,
                          advantages: torch.Tensor, token_weights: torch.Tensor,
                          entropy_weights: Optional[torch.Tensor], old_logps: Optional[torch.Tensor],
                          ref_logps: Optional[torch.Tensor], importance_ratio: Optional[torch.Tensor], config: str,
                          backend: str, workspace_bytes: int, needs_hidden_grad: bool, needs_weight_grad: bool
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                     torch.Tensor, torch.Tensor, torch.Tensor]:
    inputs = TokenInputs(mask, advantages, token_weights, entropy_weights, old_logps, ref_logps, importance_ratio)
    token_grads, (terms, kl, clip) = token_step_per_wave(inputs, decode_config(config), hidden.shape[0],
                                                         hidden.device)
    one_pass = getattr(_implementation(backend, workspace_bytes), ONE_PASS.method)
    logps, entropy, _, grad_hidden, grad_weight, grad_bias = one_pass(
        hidden, decode_head(weight, bias, head_constants), targets, token_grads, needs_hidden_grad, needs_weight_grad)
    return (logps, entropy, terms, kl, clip, or_empty(grad_hidden, hidden), or_empty(grad_weight, hidden),
            or_empty(grad_bias, hidden))


@_one_pass_token_level.register_fake
def _(hidden, weight, bias, head_constants, targets, mask, advantages, token_weights, entropy_weights, old_logps,
      ref_logps, importance_ratio, config, backend, workspace_bytes, needs_hidden_grad, needs_weight_grad):
    stats = hidden.new_empty(hidden.shape[0], dtype=stats_dtype(hidden.dtype))
    per_token = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
    return (stats, torch.empty_like(stats), per_token, torch.empty_like(per_token),
            hidden.new_empty(hidden.shape[0], dtype=torch.int8),
            *_fake_grads(hidden, weight, bias, needs_hidden_grad, needs_weight_grad))


@torch.library.custom_op("grpo_kernels::attach_grads", mutates_args=())
def _attach_grads(loss: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                  grad_hidden: torch.Tensor, grad_weight: torch.Tensor, grad_bias: torch.Tensor,
                  backend: str) -> torch.Tensor:
    return loss.clone()


@_attach_grads.register_fake
def _(loss, hidden, weight, bias, grad_hidden, grad_weight, grad_bias, backend):
    return torch.empty_like(loss)


def _attach_setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs[4:7])
    ctx.backend = inputs[7]


def _is_batched(grad: torch.Tensor) -> bool:
    """Whether `grad` holds a batch of upstream gradients behind a 0-d face: autograd's is_grads_batched (the
    legacy Batched dispatch key) or a torch.func vmap level."""
    return torch._C._functorch.is_legacy_batchedtensor(grad) or torch._C._functorch.is_functorch_wrapped_tensor(grad)


def _attach_backward(ctx, grad_loss):
    # The gradients were computed for an upstream gradient of 1; the backward only scales them, in place: the
    # saved tensors become the gradients, so no second [V, H] copy exists (autograd takes them over as .grad).
    # A graph kept for another backward (retain_graph=True) keeps them as they are and scales a copy: autograd
    # would copy them into .grad then anyway, since the graph still holds them.
    refuse_second_order(ctx.backend)
    # A batched upstream gradient (autograd.grad(..., is_grads_batched=True), jacobian(vectorize=True)) is a vmap
    # tensor holding one gradient a batch entry: the saved gradients cannot be scaled into in place (vmap refused
    # the mul_ deep in autograd); out of place, each entry gets its own scaled copy.
    in_place = not graph_is_kept() and not _is_batched(grad_loss)

    def scaled(x: torch.Tensor, needed: bool) -> Optional[torch.Tensor]:
        if not (needed and _computed(x)):
            return None
        return x.mul_(grad_loss.to(x.dtype)) if in_place else x * grad_loss.to(x.dtype)

    grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
    _, needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:4]
    return (None, scaled(grad_hidden, needs_hidden), scaled(grad_weight, needs_weight),
            scaled(grad_bias, needs_bias), None, None, None, None)


_attach_grads.register_autograd(_attach_backward, setup_context=_attach_setup_context)


def one_pass_token_level(backend: str, hidden: torch.Tensor, head: LMHead, targets: torch.Tensor,
                         inputs: TokenInputs, config: GRPOLossConfig, workspace_bytes: int, needs_hidden_grad: bool,
                         needs_weight_grad: bool):
    """Rows [N] through backend `backend`'s ONE_PASS route: (logps, entropy, terms, kl, clip, dhidden, dweight,
    dbias) of a token-level objective whose loss is terms.sum(); gradients for an upstream gradient of 1, empty
    where not needed."""
    return _one_pass_token_level(hidden.detach().contiguous(), *encode_head(head, detach=True), targets.contiguous(),
                                 *encode_inputs(inputs), encode_config(config), backend, int(workspace_bytes),
                                 bool(needs_hidden_grad), bool(needs_weight_grad))


def attach_grads(backend: str, loss: torch.Tensor, hidden: torch.Tensor, head: LMHead, grad_hidden: torch.Tensor,
                 grad_weight: torch.Tensor, grad_bias: torch.Tensor) -> torch.Tensor:
    """`loss` (a value computed without autograd by `backend`) made differentiable w.r.t. hidden and the head's
    weight and bias, with the given precomputed gradients scaled by the upstream gradient."""
    return _attach_grads(loss, hidden, head.weight, head.bias, grad_hidden, grad_weight, grad_bias, backend)


# ---- entry points for api.py --------------------------------------------------------------------------

def linear_logprobs(hidden: torch.Tensor, head: LMHead, targets: torch.Tensor, backend: str,
                    workspace_bytes: int = DEFAULT_WORKSPACE_BYTES, kept_token_ids: Optional[torch.Tensor] = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [N, H], head.weight [V, H], targets [N] -> (logps [N], entropy [N]), differentiable; with
    kept_token_ids [N, K] the rows that carry a set are scored over it."""
    logps, entropy, _ = _linear_logprobs(hidden.contiguous(), *encode_head(head), targets.contiguous(), backend,
                                         int(workspace_bytes),
                                         None if kept_token_ids is None else kept_token_ids.contiguous())
    return logps, entropy


def logits_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                    backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, T, V] (rows may be strided, e.g. logits[:, :-1]), targets [B, T] -> (logps, entropy) [B, T]."""
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    logps, entropy, _ = _logits_logprobs(logits, targets.contiguous(), float(temperature), backend)
    return logps, entropy


def linear_grpo_token_terms(backend: str, hidden: torch.Tensor, head: LMHead, targets: torch.Tensor,
                            inputs: TokenInputs, config: GRPOLossConfig):
    """Rows [N] through backend `backend`'s EPILOGUE route -> (terms, logps, entropy, kl, clip code), the
    objective in the forward kernel's epilogue; terms.sum() is the loss."""
    terms, logps, entropy, _, _, kl, clip = _linear_grpo_token_terms(
        hidden.contiguous(), *encode_head(head), targets.contiguous(), *encode_inputs(inputs), encode_config(config),
        backend)
    return terms, logps, entropy, kl, clip


# ---- what FlopCounterMode counts for the ops above (flop_formulas.py) ----------------------------------------
_flop_formulas.register()
