"""TRL GRPOTrainer's `_compute_loss`, computed by `fused_linear_grpo_loss` on the last hidden state.

What TRL's loss does and the fused objective does the same way goes through the fused loss; the few TRL
features whose arithmetic differs from the objective (listed in `fused_path_blocker`) keep TRL's own loss
code, fed with log-probs and entropies from `grpo_kernels.linear_logprobs` (see trl.py), so no path ever
builds [B, T, V] logits. Scaling for gradient accumulation, the dapo normaliser and every logged metric
follow TRL 1.16's `_compute_loss` line by line; the metric names are TRL's.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Optional

import torch

from .. import GRPOLossConfig, LogitTransform, fused_linear_grpo_loss
from ..losses import LOG_RATIO_RANGE, RATIO_CAP, TermInputs, get_loss_type
from ..objective import importance_weights, ratio_clip_flags
# Inputs of vision-language batches; the patched path handles text-only batches.
MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                   "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


def fused_path_blocker(trainer: Any, inputs: dict) -> Optional[str]:
    """Why this step keeps TRL's own loss arithmetic, or None when the fused loss reproduces it exactly."""
    args = trainer.args
    loss_type, quantile = trainer.loss_type, trainer.top_entropy_quantile
    spec = get_loss_type(loss_type)
    if any(inputs.get(key) is not None for key in MULTIMODAL_KEYS):
        return "multimodal inputs"
    if trainer.aux_loss_enabled:
        return "MoE router auxiliary loss"
    if trainer.off_policy_mask_threshold is not None:
        return "off_policy_mask_threshold (the mask needs the log-probs before the loss)"
    if trainer.use_adaptive_entropy:
        return "use_adaptive_entropy"
    if trainer.entropy_coef != 0.0 and spec.aggregation.token_normalised:
        return f"entropy_coef with loss_type={loss_type!r} (TRL averages the bonus over local tokens)"
    if trainer.entropy_coef != 0.0 and quantile < 1.0:
        return "entropy_coef with top_entropy_quantile < 1 (TRL's bonus uses the entropy-masked tokens)"
    if quantile < 1.0 and trainer.accelerator.num_processes > 1:
        return "top_entropy_quantile < 1 on several processes (TRL's quantile is over all processes)"
    if spec.sequence_weight is not None and min(args.vespo_lambda_pos, args.vespo_lambda_neg) < 1e-4:
        return f"{loss_type} lambda < 1e-4 (TRL clamps it)"
    return _settings_blocker(trainer)


def _settings_blocker(trainer: Any) -> Optional[str]:
    """The trainer's loss settings that GRPOLossConfig refuses but TRL computes with (delta <= 1, a negative
    beta or epsilon, top_entropy_quantile outside (0, 1], a sapo temperature <= 0, ...): TRL's own loss code runs
    on them, as it would without the patch. Before, the config refused them at the first step, after the first
    generation, while TRL trained."""
    try:
        with warnings.catch_warnings():  # the config warns again when the fused step builds it
            warnings.simplefilter("ignore")
            loss_config(trainer)
    except (TypeError, ValueError) as exc:
        return f"loss settings the fused loss does not take ({exc})"
    return None


def loss_config(trainer: Any) -> GRPOLossConfig:
    """GRPOLossConfig from the trainer's resolved attributes (TRL fills epsilon_high, temperature, ...)."""
    args = trainer.args
    return GRPOLossConfig(
        loss_type=trainer.loss_type, beta=float(trainer.beta), epsilon=float(trainer.epsilon_low),
        epsilon_high=float(trainer.epsilon_high), delta=args.delta,
        importance_sampling_level=trainer.importance_sampling_level, temperature=float(trainer.temperature),
        max_completion_length=trainer.max_completion_length, use_bias_correction_kl=args.use_bias_correction_kl,
        sapo_temperature_pos=args.sapo_temperature_pos, sapo_temperature_neg=args.sapo_temperature_neg,
        vespo_k_pos=args.vespo_k_pos, vespo_lambda_pos=args.vespo_lambda_pos, vespo_k_neg=args.vespo_k_neg,
        vespo_lambda_neg=args.vespo_lambda_neg, entropy_coef=float(trainer.entropy_coef),
        top_entropy_quantile=float(trainer.top_entropy_quantile),
    )


def _importance_ratio(trainer: Any, inputs: dict) -> Optional[torch.Tensor]:
    """The vLLM importance ratio where TRL applies it: VESPO folds it into its weight whenever present, the
    other types multiply by it when vLLM's correction is on."""
    ratio = inputs.get("importance_sampling_ratio")
    if ratio is None:
        return None
    if get_loss_type(trainer.loss_type).folds_importance_ratio:
        low, high = LOG_RATIO_RANGE
        return ratio.clamp(min=math.exp(low), max=math.exp(high))
    if trainer.use_vllm and trainer.vllm_importance_sampling_correction:
        return ratio
    return None


def _token_normaliser(trainer: Any, inputs: dict, training: bool) -> torch.Tensor:
    """TRL's denominator of the token-normalised loss types (losses.GLOBAL_TOKEN_MEAN): the generation batch's
    tokens per process, per accumulation window."""
    normaliser = inputs["num_items_in_batch"].clamp(min=1.0) / trainer.accelerator.num_processes
    if training:
        normaliser = normaliser * trainer.current_gradient_accumulation_steps / trainer.args.steps_per_generation
    return normaliser


def fused_compute_loss(trainer: Any, model: torch.nn.Module, inputs: dict, backend: str,
                       logit_transform: Optional[LogitTransform] = None) -> torch.Tensor:
    """TRL's `_compute_loss`, with the log-probs, the loss and its metrics from the fused kernel; `logit_transform`
    is the model's (lm_head.logit_transform), as TRL's fused head applies it."""
    prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
    completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
    mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
    completion_length = completion_ids.size(1)
    training = trainer.model.training
    mode = "train" if training else "eval"
    config = loss_config(trainer)
    ratio = _importance_ratio(trainer, inputs)
    old_logps = inputs.get("old_per_token_logps")
    ref_logps = inputs["ref_per_token_logps"] if config.beta != 0.0 else None

    num_items, extra_divisor = None, 1.0
    token_normalised = get_loss_type(config.loss_type).aggregation.token_normalised
    if token_normalised:
        normaliser = _token_normaliser(trainer, inputs, training)
        # The objective clamps its normaliser at 1; TRL does not after rescaling. Below 1, divide here instead.
        if float(normaliser) >= 1.0:
            num_items = normaliser
        else:
            num_items, extra_divisor = 1.0, normaliser

    def grpo_head(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]):
        # hidden[:, t] predicts token t + 1: the completion tokens are predicted by the positions before them.
        completion_hidden = hidden[:, -completion_length - 1:-1]
        return fused_linear_grpo_loss(
            completion_hidden, weight, completion_ids, mask, inputs["advantages"], bias=bias, old_logps=old_logps,
            ref_logps=ref_logps, importance_ratio=ratio, num_items_in_batch=num_items, config=config,
            backend=backend, logit_transform=logit_transform)

    with trainer.accelerator.autocast():
        out = model(input_ids=torch.cat([prompt_ids, completion_ids], dim=1),
                    attention_mask=torch.cat([prompt_mask, completion_mask], dim=1),
                    lm_head_fn=grpo_head).head_output

    if token_normalised:
        loss = out.loss / extra_divisor
        policy_loss = loss.detach()
    else:
        accumulation = trainer.current_gradient_accumulation_steps if training else 1.0
        loss = out.loss / accumulation
        # TRL logs the policy loss before the entropy bonus; the bonus is entropy_coef times the masked mean
        # entropy, which is exactly the `entropy` metric here.
        policy_loss = out.loss.detach() + config.entropy_coef * out.metrics["entropy"]

    if trainer._entropy_bonus_enabled:
        trainer._metrics[mode]["policy_loss"].append(trainer.accelerator.gather(policy_loss).nanmean().item())
        if training and trainer.accelerator.sync_gradients:
            trainer._metrics[mode]["entropy_coef"].append(trainer.entropy_coef)
    log_trl_metrics(trainer, mode, out, mask, inputs["advantages"], old_logps, ratio, config)
    return loss


def log_trl_metrics(trainer: Any, mode: str, out: Any, mask: torch.Tensor, advantages: torch.Tensor,
                    old_logps: Optional[torch.Tensor], ratio: Optional[torch.Tensor], config: GRPOLossConfig) -> None:
    """The metrics TRL's `_compute_loss` logs, under its names, reduced over processes as TRL does.

    `kl` and `entropy` are the fused loss's own metrics; the clip flags are the spec's (objective.ratio_clip_flags,
    TRL's definition), taken again from the fused log-probs (O(B*T)) because TRL also logs per-sequence extremes.
    """
    log = trainer._metrics[mode]
    mask = mask.float()
    token_count = mask.sum()

    def global_mean_of_local(local_mean: torch.Tensor, count: torch.Tensor) -> float:
        totals = trainer.accelerator.reduce(torch.stack([local_mean.float() * count, count.float()]), reduction="sum")
        return (totals[0] / totals[1].clamp(min=1.0)).item()

    def global_masked_mean(x: torch.Tensor) -> float:
        # As TRL: a per-sequence quantity ([B, 1]) counts sequences, a per-token one counts valid tokens.
        if x.shape[-1] == 1:
            return global_mean_of_local(x.float().mean(), torch.tensor(float(x.shape[0]), device=x.device))
        return global_mean_of_local((x.float() * mask).sum() / token_count.clamp(min=1.0), token_count)

    if config.beta != 0.0:
        log["kl"].append(global_mean_of_local(out.metrics["kl"], token_count))
    log["entropy"].append(global_mean_of_local(out.metrics["entropy"], token_count))

    spec = get_loss_type(config.loss_type)
    if spec.sequence_weight is not None:
        A = advantages[:, None] if advantages.dim() == 1 else advantages
        log_ratio, ratio_or_weight = importance_weights(out.logps, mask, old_logps, config.importance_sampling_level)
        weight = spec.sequence_weight(TermInputs(out.logps, log_ratio, ratio_or_weight, A, mask, ratio, config))
        log[f"{config.loss_type}/phi_seq_mean"].append(global_masked_mean(weight))
    if spec.clip is None:  # TRL logs no clipping for a loss that does not clip
        return
    low, high = ratio_clip_flags(out.logps, mask, advantages, config, old_logps)
    if spec.clip == RATIO_CAP:
        log[f"{config.loss_type}_clip_ratio"].append(global_masked_mean(high))
        return
    log["clip_ratio/low_mean"].append(global_masked_mean(low))
    log["clip_ratio/high_mean"].append(global_masked_mean(high))
    log["clip_ratio/region_mean"].append(global_masked_mean(torch.maximum(low, high)))
    low_per_sequence = trainer.accelerator.gather(_masked_sequence_mean(low, mask))
    log["clip_ratio/low_min"].append(_nan_reduce(low_per_sequence, torch.min))
    log["clip_ratio/high_max"].append(_nan_reduce(trainer.accelerator.gather(_masked_sequence_mean(high, mask)),
                                                  torch.max))


def _masked_sequence_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # As TRL: an empty sequence gives NaN, which the nan-aware min/max then skip.
    if x.shape[1] == 1:
        return x.squeeze(1)
    return (x * mask).sum(-1) / mask.sum(-1)


def _nan_reduce(x: torch.Tensor, reduce) -> float:
    finite = x[~torch.isnan(x)]
    return float("nan") if finite.numel() == 0 else reduce(finite).item()
