"""grpo_kernels: a fused GRPO loss that never materializes the [tokens, vocab] logits.

    from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss
    out = fused_linear_grpo_loss(hidden, lm_head.weight, completion_ids, completion_mask, advantages,
                                 config=GRPOLossConfig(loss_type="dapo", beta=0.04), ref_logps=ref_logps)
    out.loss.backward()
"""

from .kernels.launch import use_interpreter_if_no_gpu

use_interpreter_if_no_gpu()

from . import reference  # noqa: E402
from .api import fused_linear_grpo_loss, grpo_loss_from_logits, linear_logprobs  # noqa: E402
from .config import GRPOLossConfig  # noqa: E402
from .head import LMHead, LogitTransform  # noqa: E402
from .module import FusedLinearGRPOLoss  # noqa: E402
from .objective import GRPOLossOutput, grpo_objective  # noqa: E402

__all__ = [
    "GRPOLossConfig",
    "GRPOLossOutput",
    "LMHead",
    "LogitTransform",
    "FusedLinearGRPOLoss",
    "fused_linear_grpo_loss",
    "grpo_loss_from_logits",
    "grpo_objective",
    "linear_logprobs",
    "reference",
]
__version__ = "0.1.0"
