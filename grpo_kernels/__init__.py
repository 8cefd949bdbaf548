"""grpo_kernels: a fused GRPO loss that never materializes the [tokens, vocab] logits.

    from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss
    out = fused_linear_grpo_loss(hidden, lm_head.weight, completion_ids, completion_mask, advantages,
                                 config=GRPOLossConfig(loss_type="dapo", beta=0.04), ref_logps=ref_logps)
    out.loss.backward()
"""

from . import reference
from .api import fused_linear_grpo_loss, grpo_loss_from_logits, linear_logprobs
from .config import GRPOLossConfig
from .module import FusedLinearGRPOLoss
from .objective import GRPOLossOutput, grpo_objective

__all__ = [
    "GRPOLossConfig",
    "GRPOLossOutput",
    "FusedLinearGRPOLoss",
    "fused_linear_grpo_loss",
    "grpo_loss_from_logits",
    "grpo_objective",
    "linear_logprobs",
    "reference",
]
__version__ = "0.1.0"
