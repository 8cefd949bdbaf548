"""What is measured: the operations, the loss configurations and the logit regimes."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from grpo_kernels import GRPOLossConfig

# loss: fused loss forward + backward (the training step); logprobs: forward-only per-token log-probs
# (how old/ref log-probs are computed); logits: the loss from precomputed logits, forward + backward.
OPERATIONS = ("loss", "logprobs", "logits")

# flat: random hidden and weight, near-uniform softmax. peaked: weight scaled until the mean token
# entropy is PEAKED_TARGET_ENTROPY nats, as for a trained LM; sparsity tricks behave differently on each.
REGIMES = ("flat", "peaked")
PEAKED_TARGET_ENTROPY = 0.8


@dataclass(frozen=True)
class LossCase:
    name: str
    config: GRPOLossConfig
    uses_old_logps: bool
    uses_ref_logps: bool
    frozen_head: bool = False  # weight.requires_grad False (LoRA): only dH is asked for
    # None: the inputs' own mask. A fraction: a right-padded mask with that fraction of ones (benchmarks.suite.paths).
    valid_fraction: Optional[float] = None


# The cases every path runs at every shape (test_loss.py, test_logits_loss.py).
STANDARD_LOSS_CASES: dict[str, LossCase] = {
    # TRL's default: dapo, no KL, on-policy (old log-probs are the detached current ones).
    "dapo": LossCase("dapo", GRPOLossConfig(), uses_old_logps=False, uses_ref_logps=False),
    # The DeepSeekMath paper's setting: per-sequence mean, beta = 0.04 with a reference model, off-policy.
    "grpo_kl": LossCase("grpo_kl", GRPOLossConfig(loss_type="grpo", beta=0.04), uses_old_logps=True,
                        uses_ref_logps=True),
    # GSPO as TRL documents it: sequence-level importance ratio, epsilon 3e-4 / 4e-4, no KL.
    "gspo": LossCase("gspo", GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence",
                                            epsilon=3e-4, epsilon_high=4e-4),
                     uses_old_logps=True, uses_ref_logps=False),
}

# The setting of the target shapes (benchmarks/suite/shapes.py): dapo with beta = 0.04, old and reference log-probs
# given.
_DAPO_KL = LossCase("dapo_kl", GRPOLossConfig(beta=0.04), uses_old_logps=True, uses_ref_logps=True)
VALID_FRACTIONS = (1.0, 0.5, 0.25)


def _variant(name: str, **changes) -> LossCase:
    return replace(_DAPO_KL, name=name, **changes)


# Frozen head and padding rows (test_variants.py, the GPU command); looked up by name like the standard ones.
VARIANT_LOSS_CASES: dict[str, LossCase] = {
    "dapo_kl": _DAPO_KL,
    "dapo_kl_frozen": _variant("dapo_kl_frozen", frozen_head=True),
    **{f"dapo_kl_valid{round(f * 100)}": _variant(f"dapo_kl_valid{round(f * 100)}", valid_fraction=f)
       for f in VALID_FRACTIONS},
    **{f"dapo_kl_frozen_valid{round(f * 100)}": _variant(f"dapo_kl_frozen_valid{round(f * 100)}", frozen_head=True,
                                                         valid_fraction=f) for f in VALID_FRACTIONS},
    # Sequence-level in the target setting (GSPO's ratio with the KL term and both log-probs).
    "gspo_kl": LossCase("gspo_kl", GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence", beta=0.04,
                                                  epsilon=3e-4, epsilon_high=4e-4),
                        uses_old_logps=True, uses_ref_logps=True),
    # GSPO as TRL documents it, on-policy (TRL's and the engine's default num_iterations = 1: no old log-probs):
    # its ratio then trains as the per-token one, and the call runs as a token-level loss (docs/math.md).
    "gspo_on_policy": LossCase("gspo_on_policy", GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence",
                                                                epsilon=3e-4, epsilon_high=4e-4),
                               uses_old_logps=False, uses_ref_logps=False),
}

LOSS_CASES: dict[str, LossCase] = {**STANDARD_LOSS_CASES, **VARIANT_LOSS_CASES}


def flops(operation: str, tokens: int, hidden: int, vocab: int) -> int:
    """Useful FLOPs, counting 2*N*H*V per GEMM-equivalent (the logits-input loss has none)."""
    gemms = {"loss": 3, "logprobs": 1, "logits": 0}[operation]
    return 2 * gemms * tokens * hidden * vocab
