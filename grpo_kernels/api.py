"""The public functions: validate, choose the rows and a backend, stream the log-probs, apply the objective."""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Callable, Optional, TypeVar, Union

import torch

from . import ops, reference, routing, sequence_route
from .argument_names import LOGITS_NAMES, LOGPROB_NAMES, LOSS_NAMES, ArgumentNames
from .backends import (AUTO, DEFAULT_BACKEND, ONE_PASS, TokenLevelRoute, check_backend_name, get_backend,
                       refuse_unsupported, token_level_route, vocab_parallel)
from .backends.sharded_head import resolve_sharded_head
from .config import GRPOLossConfig
from .dispatch_modes import caller_dispatch_mode
from .head import LMHead, LogitTransform
from .keywords import accepted_keywords, refuse_unknown_keywords
from .layout import TokenLayout
from .messages import shown
from .objective import (GRPOLossOutput, TokenInputs, grpo_loss_output, objective_loss, on_policy_token_level,
                        token_inputs, token_metrics)
from .second_order import deterministic_refusal_asked, refuse_forward_ad
from .torchscript import outside_torchscript
from .validation import (as_token_ids, bias_in_weight_dtype, check_backend_dtype, check_config, check_cu_seqlens,
                         check_kept_token_ids, check_linear_inputs, check_logit_factors, check_logit_transform,
                         check_logits, check_loss_inputs, check_mask, check_packed_inputs, check_targets,
                         check_temperature, check_workspace, ids_where_scored, outside_inference_mode,
                         trainer_advantages)

# "auto" or the name of a backend registered when the call is made (grpo_kernels/backends/__init__.py): a str,
# not a Literal of today's names, since register_backend adds names after import.
Backend = str


_Function = TypeVar("_Function", bound=Callable)


def optional_by_keyword(function: _Function) -> _Function:
    """`function`'s keyword-only parameters still taken by position for now, with a FutureWarning naming them (they
    were positional until this release): the required parameters stay positional, every option is keyword-only."""
    parameters = inspect.signature(function).parameters.values()
    required = sum(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters)
    options = [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]
    accepted = accepted_keywords(function)

    @functools.wraps(function)
    def call(*args, **kwargs):
        refuse_unknown_keywords(function.__name__, accepted, kwargs)
        if len(args) > required:
            extra = args[required:]
            if len(extra) > len(options):
                raise TypeError(f"{function.__name__}() takes {required} positional arguments and {len(options)} "
                                f"keyword arguments, got {len(args)} positional")
            named = options[:len(extra)]
            twice = [name for name in named if name in kwargs]
            if twice:
                raise TypeError(f"{function.__name__}() got multiple values for {twice}")
            warnings.warn(f"{function.__name__}(): passing {', '.join(named)} by position is deprecated and will be "
                          f"an error; pass {'them' if len(named) > 1 else 'it'} by keyword ({named[0]}=...)",
                          FutureWarning, stacklevel=2)
            args, kwargs = args[:required], {**kwargs, **dict(zip(named, extra))}
        return function(*args, **kwargs)

    return call  # type: ignore[return-value]


def without_autocast(function: _Function) -> _Function:
    """`function` with autocast off on CPU and CUDA: inside a caller's torch.autocast region (a trainer's mixed
    precision) torch's matmuls would run in the autocast dtype on the backends built of torch ops (`torch`,
    `reference`: errors of 1e-3 to 1e-1) while the kernel backends keep float32, so the result would depend on the
    backend. The inputs keep their own dtypes; every backend computes as without autocast."""
    @functools.wraps(function)
    def call(*args, **kwargs):
        with torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
            return function(*args, **kwargs)

    return call  # type: ignore[return-value]


def resolve_backend(backend: str, device: torch.device) -> str:
    """The backend name, checked; 'auto' is routed per call by the cost model once the call's shapes are known
    (routing.py): on a CPU it is the GEMM path."""
    return check_backend_name(backend)  # one clear error for an unknown name, listing the registered ones


def _checking_values() -> bool:
    # Value checks (NaN scans, id ranges) synchronise with the device and would break a compiled graph;
    # under torch.compile only the static shape/dtype/device checks run.
    return not torch.compiler.is_compiling()


def _device_of(x: object) -> torch.device:
    return x.device if isinstance(x, torch.Tensor) else torch.device("cpu")


def _head(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], temperature: float,
          logit_transform: Optional[LogitTransform], process_group: Optional[object], backend: str,
          kept_token_ids: Optional[torch.Tensor], names: ArgumentNames, temperature_name: str = "temperature"
          ) -> LMHead:
    """The one LMHead every path below takes: the caller's head arguments, checked, its shard resolved; an explicit
    backend that does not declare what the call needs (its registry entry) is refused here, before any work."""
    transform = check_logit_transform(logit_transform)
    logit_factor = check_logit_factors(transform, temperature, temperature_name)
    if backend != AUTO:
        refuse_unsupported(backend, kept_sets=kept_token_ids is not None, transformed=not transform.is_identity,
                           compiling=not _checking_values(), deterministic=deterministic_refusal_asked(backend))
    weight, bias, shard = resolve_sharded_head(hidden, weight, bias, process_group, backend)
    check_linear_inputs(hidden, weight, bias, check_finite=_checking_values(), names=names, logit_factor=logit_factor)
    check_backend_dtype(backend, hidden, names.hidden)
    bias = bias_in_weight_dtype(weight, bias)
    return LMHead(weight, bias, temperature, transform, shard)


def _needs_grads(hidden: torch.Tensor, head: LMHead) -> tuple[bool, bool]:
    """(hidden needs a gradient, weight or bias does): a frozen head does no dW work, no_grad none at all."""
    if not torch.is_grad_enabled():
        return False, False
    return hidden.requires_grad, head.weight_needs_grad()


def _row_logprobs(backend: str, hidden: torch.Tensor, head: LMHead, targets: torch.Tensor, workspace_bytes: int,
                  kept_token_ids: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logps, entropy) [R] of hidden rows [R, H], differentiable; rows with a kept set [R, K] over that set."""
    if head.shard is not None:
        return vocab_parallel.row_logprobs(backend, hidden, head, targets, workspace_bytes, kept_token_ids)
    if get_backend(backend).materializes_logits:  # plain autograd through the eager formula: nothing to stream
        return reference.head_logprobs(hidden, head, targets, kept_token_ids)
    return ops.linear_logprobs(hidden, head, targets, backend, workspace_bytes, kept_token_ids)


def _no_sets_on_padding(kept_token_ids: Optional[torch.Tensor], mask: Optional[torch.Tensor]
                        ) -> Optional[torch.Tensor]:
    """Padded positions carry no set (their target need not be in it; under torch.compile they still reach the
    head, where a target outside its set would give a log-prob of -inf)."""
    if kept_token_ids is None or mask is None:
        return kept_token_ids
    return torch.where(mask[..., None] != 0, kept_token_ids, torch.full_like(kept_token_ids, -1))


def _flat_kept(kept_token_ids: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if kept_token_ids is None else kept_token_ids.reshape(-1, kept_token_ids.shape[-1]).long()


@outside_torchscript
@optional_by_keyword
def linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                    bias: Optional[torch.Tensor] = None, temperature: float = 1.0, return_entropy: bool = False,
                    backend: Backend = "auto", mask: Optional[torch.Tensor] = None,
                    workspace_bytes: Optional[int] = None, process_group: Optional[object] = None,
                    logit_transform: Optional[LogitTransform] = None, kept_token_ids: Optional[torch.Tensor] = None
                    ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Per-token float32 log-probs of `targets` (and entropies) under softmax(transform(hidden W^T + bias) /
    temperature), `transform` the model's `logit_transform` (a scale and a tanh soft-cap; None: none).

    hidden [..., H], weight [V, H], targets [...] int64. Differentiable w.r.t. hidden, weight and bias; no
    [tokens, vocab] tensor is ever allocated (except by backend='reference'). With `mask` ([...], 0/1), only the
    positions where it is nonzero go through the head; the others get log-prob 0 and entropy 0.
    A vocabulary-sharded head (a DTensor weight placed Shard(0), or this rank's rows plus `process_group`): see
    `fused_linear_grpo_loss`. `kept_token_ids` [..., K]: see `fused_linear_grpo_loss`.
    """
    return linear_logprobs_named(
        LOGPROB_NAMES, hidden, weight, targets, bias=bias, temperature=temperature, return_entropy=return_entropy,
        backend=backend, mask=mask, workspace_bytes=workspace_bytes, process_group=process_group,
        logit_transform=logit_transform, kept_token_ids=kept_token_ids)


@outside_torchscript
@without_autocast
def linear_logprobs_named(names: ArgumentNames, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          *, bias: Optional[torch.Tensor] = None, temperature: float = 1.0,
                          return_entropy: bool = False, backend: Backend = "auto",
                          mask: Optional[torch.Tensor] = None, workspace_bytes: Optional[int] = None,
                          process_group: Optional[object] = None, logit_transform: Optional[LogitTransform] = None,
                          kept_token_ids: Optional[torch.Tensor] = None
                          ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """linear_logprobs, its refusals naming the inputs as `names` does (the caller's names for them: the
    Liger-compatible module's ref_input, ref_weight, ...)."""
    if not isinstance(return_entropy, bool):
        raise TypeError(f"return_entropy must be True or False, got {shown(return_entropy)}")
    backend = resolve_backend(backend, _device_of(hidden))
    hidden, weight, bias, targets, mask, kept_token_ids = outside_inference_mode(
        hidden, weight, bias, targets, mask, kept_token_ids)
    refuse_forward_ad(backend, **{names.hidden: hidden, names.weight: weight, names.bias: bias})
    targets = as_token_ids(ids_where_scored(targets, mask))  # a padded position's id is never read
    temperature = check_temperature(temperature)
    head = _head(hidden, weight, bias, temperature, logit_transform, process_group, backend, kept_token_ids, names)
    batch_shape = tuple(hidden.shape[:-1])
    check_targets(names.targets, targets, batch_shape, head.vocab_size, hidden.device,
                  check_values=_checking_values(), anchor=names.hidden)
    if mask is not None:  # before the kept sets, which it selects, and before any work
        check_mask(names.mask, mask, batch_shape, hidden.device, _checking_values(), names.hidden)
    check_kept_token_ids(kept_token_ids, targets, head.vocab_size, mask, check_values=_checking_values(),
                         targets_name=names.targets)
    kept_token_ids = _no_sets_on_padding(kept_token_ids, mask)
    backend, workspace_bytes = routing.resolve(
        backend, None if workspace_bytes is None else check_workspace(workspace_bytes), hidden, head,
        kept_sets=kept_token_ids is not None)
    flat_hidden, flat_targets, flat_kept = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1), \
        _flat_kept(kept_token_ids)
    if mask is None:
        logps, entropy = _row_logprobs(backend, flat_hidden, head, flat_targets, workspace_bytes, flat_kept)
    else:
        layout = TokenLayout.padded(mask.reshape(1, -1), compact=_checking_values())
        logps, entropy = _row_logprobs(backend, layout.head_rows(flat_hidden), head, layout.head_rows(flat_targets),
                                       workspace_bytes, None if flat_kept is None else layout.head_rows(flat_kept))
        logps, entropy = layout.to_grid(logps).reshape(-1), layout.to_grid(entropy).reshape(-1)
    logps, entropy = logps.view(targets.shape), entropy.view(targets.shape)
    return (logps, entropy) if return_entropy else logps


@outside_torchscript
@optional_by_keyword
def fused_linear_grpo_loss(hidden: torch.Tensor, weight: torch.Tensor, completion_ids: torch.Tensor,
                           completion_mask: Optional[torch.Tensor], advantages: torch.Tensor, *,
                           bias: Optional[torch.Tensor] = None, old_logps: Optional[torch.Tensor] = None,
                           ref_logps: Optional[torch.Tensor] = None,
                           importance_ratio: Optional[torch.Tensor] = None,
                           num_items_in_batch: Optional[Union[torch.Tensor, int, float]] = None,
                           config: Optional[GRPOLossConfig] = None,
                           backend: Backend = "auto", cu_seqlens: Optional[torch.Tensor] = None,
                           workspace_bytes: Optional[int] = None, process_group: Optional[object] = None,
                           logit_transform: Optional[LogitTransform] = None,
                           kept_token_ids: Optional[torch.Tensor] = None) -> GRPOLossOutput:
    """The GRPO loss from the policy's last hidden states and LM head [V, H], without logits.

    The policy's logits are transform(hidden W^T + bias) / config.temperature, `transform` the model's
    `logit_transform` (LogitTransform(scale=, softcap=): Gemma 2/3's final_logit_softcapping, Cohere's
    logit_scale, ...; None for a plain head).

    Padded form: hidden [B, T, H], completion_ids / completion_mask / old_logps / ref_logps [B, T]. Only the
    positions with completion_mask != 0 go through the head; `logps` is 0 at the others.
    Packed form (`cu_seqlens` [S + 1], int, from 0 to N): hidden [N, H] holds S sequences back to back,
    completion_ids / old_logps / ref_logps / importance_ratio are [N], completion_mask is [N] or None (all valid),
    advantages [S] or [N]; `logps` comes back [N].
    Vocabulary-sharded head: `weight` (and `bias`) a DTensor placed Shard(0) on a 1-D mesh, or this rank's rows
    of the head with `process_group=`; every rank passes the same hidden and inputs (completion_ids are global
    token ids) and gets the same loss, metrics and logps, dH summed over the group, and its own shard's dW/dbias.
    Kept-token sets (`kept_token_ids` [B, T, K], packed [N, K], int64, -1 padding): the ids a top-p / top-k
    sampler kept at each position; the log-prob and entropy there are those of the distribution renormalised over
    the set (after temperature), as the sampler drew from it. A position whose set is all -1 is scored over the
    whole vocabulary; the target must be in its set.
    """
    return fused_linear_grpo_loss_named(
        LOSS_NAMES, hidden, weight, completion_ids, completion_mask, advantages, bias=bias, old_logps=old_logps,
        ref_logps=ref_logps, importance_ratio=importance_ratio, num_items_in_batch=num_items_in_batch, config=config,
        backend=backend, cu_seqlens=cu_seqlens, workspace_bytes=workspace_bytes, process_group=process_group,
        logit_transform=logit_transform, kept_token_ids=kept_token_ids)


@outside_torchscript
@without_autocast
def fused_linear_grpo_loss_named(
        names: ArgumentNames, hidden: torch.Tensor, weight: torch.Tensor, completion_ids: torch.Tensor,
        completion_mask: Optional[torch.Tensor], advantages: torch.Tensor, *, bias: Optional[torch.Tensor] = None,
        old_logps: Optional[torch.Tensor] = None, ref_logps: Optional[torch.Tensor] = None,
        importance_ratio: Optional[torch.Tensor] = None,
        num_items_in_batch: Optional[Union[torch.Tensor, int, float]] = None,
        config: Optional[GRPOLossConfig] = None, backend: Backend = "auto", cu_seqlens: Optional[torch.Tensor] = None,
        workspace_bytes: Optional[int] = None, process_group: Optional[object] = None,
        logit_transform: Optional[LogitTransform] = None, kept_token_ids: Optional[torch.Tensor] = None
) -> GRPOLossOutput:
    """fused_linear_grpo_loss, its refusals naming the inputs as `names` does (the caller's names for them: the
    Liger-compatible module's _input, lin_weight, selected_token_ids, ...)."""
    config = check_config(config)
    backend = resolve_backend(backend, _device_of(hidden))
    (hidden, weight, bias, completion_ids, completion_mask, advantages, old_logps, ref_logps, importance_ratio,
     num_items_in_batch, cu_seqlens, kept_token_ids) = outside_inference_mode(
        hidden, weight, bias, completion_ids, completion_mask, advantages, old_logps, ref_logps, importance_ratio,
        num_items_in_batch, cu_seqlens, kept_token_ids)
    refuse_forward_ad(backend, **{names.hidden: hidden, names.weight: weight, names.bias: bias,
                                  names.advantages: advantages, names.old_logps: old_logps,
                                  names.ref_logps: ref_logps, names.importance_ratio: importance_ratio,
                                  names.num_items_in_batch: num_items_in_batch})
    completion_ids = as_token_ids(ids_where_scored(completion_ids, completion_mask))  # padding's ids: never read
    # the padded form's [B, 1] advantages (TRL's broadcast) are its [B]; integer ones are float32 in either form
    advantages = trainer_advantages(advantages, hidden if cu_seqlens is None else None)
    config = on_policy_token_level(config, on_policy=old_logps is None, importance_ratio=importance_ratio is not None,
                                   advantages_per_sequence=_one_advantage_per_sequence(advantages, cu_seqlens))
    head = _head(hidden, weight, bias, config.temperature, logit_transform, process_group, backend, kept_token_ids,
                 names, temperature_name="config.temperature")
    workspace_bytes = None if workspace_bytes is None else check_workspace(workspace_bytes)
    values = _checking_values()
    H = hidden.shape[-1]
    if cu_seqlens is None:
        if hidden.dim() != 3:
            raise ValueError(f"{names.hidden} must be [B, T, H] (or [N, H] with cu_seqlens), got shape "
                             f"{list(hidden.shape)}")
        B, T = hidden.shape[:2]
        check_targets(names.targets, completion_ids, (B, T), head.vocab_size, hidden.device, values, names.hidden)
        check_loss_inputs((B, T), hidden.device, completion_mask, advantages, old_logps, ref_logps,
                          importance_ratio, num_items_in_batch, config, values, names)
        check_kept_token_ids(kept_token_ids, completion_ids, head.vocab_size, completion_mask, values,
                             names.targets)
        kept_token_ids = _no_sets_on_padding(kept_token_ids, completion_mask)
        layout = TokenLayout.padded(completion_mask, compact=values)
    else:
        if hidden.dim() != 2:
            raise ValueError(f"with cu_seqlens, {names.hidden} must be packed [N, H], got shape "
                             f"{list(hidden.shape)}")
        N = hidden.shape[0]
        S = check_cu_seqlens(cu_seqlens, N, hidden.device, values, anchor=names.hidden)
        cu_seqlens = as_token_ids(cu_seqlens)  # any integer width, as the layout's index ops take int64
        check_targets(names.targets, completion_ids, (N,), head.vocab_size, hidden.device, values, names.hidden)
        if completion_mask is not None:
            check_mask(names.mask, completion_mask, (N,), hidden.device, values, names.hidden)
        # their metadata before the layout moves them onto the grid (a tensor elsewhere failed inside that copy)
        check_packed_inputs(N, S, hidden.device, advantages, old_logps, ref_logps, importance_ratio, names)
        check_kept_token_ids(kept_token_ids, completion_ids, head.vocab_size, completion_mask, values,
                             names.targets)
        kept_token_ids = _no_sets_on_padding(kept_token_ids, completion_mask)
        layout = TokenLayout.packed(cu_seqlens, completion_mask, N)
        if isinstance(advantages, torch.Tensor) and advantages.dim() == 1 and advantages.shape[0] == N and N != S:
            advantages = layout.packed_to_grid(advantages, cu_seqlens)
        old_logps, ref_logps = (layout.packed_to_grid(x, cu_seqlens) for x in (old_logps, ref_logps))
        importance_ratio = layout.packed_to_grid(importance_ratio, cu_seqlens, fill=1.0)
        completion_mask = layout.mask
        check_loss_inputs(layout.batch_shape, hidden.device, completion_mask, advantages, old_logps, ref_logps,
                          importance_ratio, num_items_in_batch, config, values, names)

    backend, workspace_bytes = routing.resolve(
        backend, workspace_bytes, hidden, head, config, kept_sets=kept_token_ids is not None,
        sequence_rows=sequence_route.longest_sequence(backend, config, layout, head, hidden,
                                                      kept_sets=kept_token_ids is not None, compiling=not values))
    hidden_rows = layout.head_rows(hidden.reshape(-1, H))
    target_rows = layout.head_rows(completion_ids.reshape(-1))
    kept_rows = None if kept_token_ids is None else layout.head_rows(_flat_kept(kept_token_ids))
    route = token_level_route(backend, config, kept_sets=kept_rows is not None, sharded=head.shard is not None,
                              compiling=not values, float64=head.weight.dtype == torch.float64,
                              dispatch_mode=caller_dispatch_mode())
    waves = None if route is not None else sequence_route.waves_for(
        backend, config, layout, head, hidden_rows, workspace_bytes, kept_sets=kept_rows is not None,
        compiling=not values)
    if waves is not None:  # a loss separable by sequence: one pass over waves of whole sequences
        loss, metrics, logps = sequence_route.sequence_level_in_waves(
            backend, waves, hidden_rows, head, target_rows, layout, advantages, config, old_logps, ref_logps,
            importance_ratio, num_items_in_batch, workspace_bytes)
    elif route is None:  # the two-step route: statistics, the objective by autograd, gradients from g and e
        logps, entropy = _row_logprobs(backend, hidden_rows, head, target_rows, workspace_bytes, kept_rows)
        loss, metrics = objective_loss(layout.to_grid(logps), layout.to_grid(entropy), layout.mask, advantages,
                                       config, old_logps=old_logps, ref_logps=ref_logps,
                                       importance_ratio=importance_ratio, num_items_in_batch=num_items_in_batch)
    else:  # the objective per token inside the streaming pass, evaluated once
        rows = _token_rows(layout, config, num_items_in_batch, advantages, old_logps, ref_logps, importance_ratio)
        loss, logps, entropy, kl, clip = _fused_token_level(route, backend, hidden_rows, head, target_rows, rows,
                                                            config, workspace_bytes)
        metrics = token_metrics(entropy, kl, clip, rows.mask, config)
    logps = logps.detach().float()
    out_logps = layout.to_grid(logps) if cu_seqlens is None else layout.output_rows(logps, hidden.shape[0])
    return GRPOLossOutput(loss=loss, metrics=metrics, logps=out_logps)


def _one_advantage_per_sequence(advantages: object, cu_seqlens: Optional[torch.Tensor]) -> bool:
    """Whether `advantages` holds one value a sequence ([B], or [S] packed) rather than one a token (checked later)."""
    if not isinstance(advantages, torch.Tensor) or advantages.dim() != 1:
        return False
    return cu_seqlens is None or (isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dim() == 1
                                  and advantages.shape[0] == cu_seqlens.shape[0] - 1)


def _token_rows(layout: TokenLayout, config: GRPOLossConfig, num_items_in_batch, advantages, old_logps, ref_logps,
                importance_ratio) -> TokenInputs:
    """The token-level objective's per-token inputs, for the rows that go through the head."""
    grid = token_inputs(layout.mask, advantages, config, num_items_in_batch, old_logps, ref_logps, importance_ratio)
    B, T = layout.batch_shape
    return TokenInputs(**{name: None if x is None else layout.per_row(x.view(B, T)) for name, x in vars(grid).items()})


def _fused_token_level(route: TokenLevelRoute, backend: str, hidden, head: LMHead, targets, rows: TokenInputs,
                       config, workspace_bytes):
    """The objective per token inside `backend`'s streaming pass, by its route. ONE_PASS: statistics, the objective
    and its gradients in the forward; the backward only scales the precomputed gradients. EPILOGUE: the objective
    in the forward kernel's epilogue, the backend's backward from its g and e."""
    if route is not ONE_PASS:
        terms, logps, entropy, kl, clip = ops.linear_grpo_token_terms(backend, hidden, head, targets, rows, config)
        return terms.sum(), logps, entropy, kl, clip
    needs_hidden_grad, needs_weight_grad = _needs_grads(hidden, head)
    one_pass = ops if head.shard is None else vocab_parallel  # the same signature: one head, or its shard
    logps, entropy, terms, kl, clip, grad_hidden, grad_weight, grad_bias = one_pass.one_pass_token_level(
        backend, hidden, head, targets, rows, config, workspace_bytes, needs_hidden_grad, needs_weight_grad)
    loss = terms.sum()
    if needs_hidden_grad or needs_weight_grad:
        loss = ops.attach_grads(backend, loss, hidden, head, grad_hidden, grad_weight, grad_bias)
    return loss, logps, entropy, kl, clip


@outside_torchscript
@optional_by_keyword
@without_autocast
def grpo_loss_from_logits(logits: torch.Tensor, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                          advantages: torch.Tensor, *, old_logps: Optional[torch.Tensor] = None,
                          ref_logps: Optional[torch.Tensor] = None, importance_ratio: Optional[torch.Tensor] = None,
                          num_items_in_batch: Optional[Union[torch.Tensor, int, float]] = None,
                          config: Optional[GRPOLossConfig] = None, backend: Backend = "auto") -> GRPOLossOutput:
    """The GRPO loss from logits [B, T, V] the caller already has; no second [B, T, V] tensor is made."""
    config = check_config(config)
    # the logits are already there: no head to route; 'auto' streams them as the default backend does
    backend = DEFAULT_BACKEND if resolve_backend(backend, _device_of(logits)) == AUTO else backend
    (logits, completion_ids, completion_mask, advantages, old_logps, ref_logps, importance_ratio,
     num_items_in_batch) = outside_inference_mode(logits, completion_ids, completion_mask, advantages, old_logps,
                                                  ref_logps, importance_ratio, num_items_in_batch)
    refuse_forward_ad(backend, logits=logits, advantages=advantages, old_logps=old_logps, ref_logps=ref_logps,
                      importance_ratio=importance_ratio, num_items_in_batch=num_items_in_batch)
    completion_ids = as_token_ids(ids_where_scored(completion_ids, completion_mask))  # padding's ids: never read
    advantages = trainer_advantages(advantages, logits)
    if isinstance(logits, torch.Tensor):
        check_backend_dtype(backend, logits, "logits")  # a non-tensor: check_logits names it
    if get_backend(backend).materializes_logits:
        return reference.grpo_loss_from_logits(logits, completion_ids, completion_mask, advantages, old_logps,
                                               ref_logps, importance_ratio, num_items_in_batch, config)
    values = _checking_values()
    check_logits(logits, check_finite=values, temperature=config.temperature)
    B, T, V = logits.shape
    check_targets("completion_ids", completion_ids, (B, T), V, logits.device, values, anchor="logits")
    check_loss_inputs((B, T), logits.device, completion_mask, advantages, old_logps, ref_logps,
                      importance_ratio, num_items_in_batch, config, values, LOGITS_NAMES)
    # the logits are already there: the streaming row pass over them (the backend's logits module)
    logps, entropy = ops.logits_logprobs(logits, completion_ids, config.temperature, backend)
    return grpo_loss_output(logps, entropy, completion_mask, advantages, old_logps, ref_logps, importance_ratio,
                            num_items_in_batch, config)
