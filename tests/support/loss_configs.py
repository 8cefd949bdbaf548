"""The loss configurations the parity tests run, by name: every loss type and option, and the head transforms of
some (tests/grpo_kernels/test_api.py on one process, tests/support/vocab_parallel_worker.py on a vocabulary
shard)."""

from typing import Optional

from grpo_kernels import LogitTransform

CONFIGS = {
    "dapo_default": dict(),
    "dapo_beta_kl": dict(beta=0.04, use_bias_correction_kl=False),  # the plain k3 KL (TRL's default corrects it)
    "grpo_seq_gspo": dict(loss_type="grpo", importance_sampling_level="sequence", beta=0.04),
    "bnpo_eps_high": dict(loss_type="bnpo", epsilon_high=0.28),
    "dr_grpo_delta": dict(loss_type="dr_grpo", max_completion_length=8, delta=1.3),
    "cispo": dict(loss_type="cispo", epsilon_high=1.1),
    "sapo": dict(loss_type="sapo", beta=0.02),
    "luspo_seq": dict(loss_type="luspo", importance_sampling_level="sequence"),
    "luspo_token_kl": dict(loss_type="luspo", beta=0.04),
    "vespo": dict(loss_type="vespo"),
    "bias_corrected_kl": dict(beta=0.1, use_bias_correction_kl=True),
    "temperature": dict(temperature=0.7, beta=0.04),
    "entropy_bonus": dict(entropy_coef=0.05),
    "entropy_mask": dict(top_entropy_quantile=0.4, loss_type="grpo"),
    "seq_delta_rho": dict(importance_sampling_level="sequence", delta=1.2, loss_type="bnpo"),
    "softcap_temperature": dict(temperature=0.7, beta=0.04),
    "scale_softcap_entropy_bonus": dict(entropy_coef=0.05),
    "scale_softcap_gspo_entropy": dict(loss_type="grpo", importance_sampling_level="sequence", entropy_coef=0.02),
    "divided_scale_bnpo": dict(loss_type="bnpo", beta=0.04),
}
# The cases whose head transforms its logits (a model's logit_transform): a Gemma-style soft-cap that the raw
# logits (std ~3) saturate, a scale with it (the entropy gradient through both, on the one-pass and the two-step
# routes), and a Granite-style division alone.
TRANSFORMS = {
    "softcap_temperature": LogitTransform(softcap=2.5),
    "scale_softcap_entropy_bonus": LogitTransform(scale=1.7, softcap=4.0),
    "scale_softcap_gspo_entropy": LogitTransform(scale=0.6, softcap=3.0),
    "divided_scale_bnpo": LogitTransform(scale=1 / 1.5),
}


def head_kwargs(name) -> dict:
    """The case's head arguments beyond the weight and bias (its logit transform, if any)."""
    return dict(logit_transform=TRANSFORMS[name]) if name in TRANSFORMS else {}


def importance_ratio_kind(name: str) -> Optional[str]:
    """The importance ratio rho a case passes: per token for the cases that test it (and vespo, which reads it)."""
    return "token" if "rho" in name or name == "vespo" else None
