"""The names a caller gave the loss's inputs, for the boundary's error messages.

The checks in validation.py are shared by every entry point, but the entry points name the same input differently:
`fused_linear_grpo_loss`'s `completion_ids` is `linear_logprobs`'s `targets` and the Liger-compatible module's
`selected_token_ids`. Each entry point hands the checks its own ArgumentNames, so a refusal names the argument the
caller actually wrote (a module's `lin_weight`, not the `weight` of a function the caller never called)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArgumentNames:
    """Each input's role (the field) and the name its entry point gives it (the value)."""

    hidden: str = "hidden"
    weight: str = "weight"
    bias: str = "bias"
    targets: str = "completion_ids"
    mask: str = "completion_mask"
    advantages: str = "advantages"
    old_logps: str = "old_logps"
    ref_logps: str = "ref_logps"
    importance_ratio: str = "importance_ratio"
    num_items_in_batch: str = "num_items_in_batch"
    kept_token_ids: str = "kept_token_ids"
    cu_seqlens: str = "cu_seqlens"


LOSS_NAMES = ArgumentNames()  # fused_linear_grpo_loss, grpo_loss_from_logits
LOGPROB_NAMES = ArgumentNames(targets="targets", mask="mask")  # linear_logprobs
LOGITS_NAMES = ArgumentNames(hidden="logits")  # grpo_loss_from_logits: its logits stand where hidden would
