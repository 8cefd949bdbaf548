"""FusedLinearGRPOLoss: the constructor and forward of Liger Kernel's LigerFusedLinearGRPOLoss.

Swapping `from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss` for
`from grpo_kernels import FusedLinearGRPOLoss as LigerFusedLinearGRPOLoss` is the whole migration.
Liger's performance knobs (`compiled`, `chunk_size`) are accepted and ignored: the kernels stream
over the vocabulary whatever they say.
"""

from __future__ import annotations

from typing import Optional

import torch

from .api import Backend, fused_linear_grpo_loss, linear_logprobs
from .config import GRPOLossConfig


class FusedLinearGRPOLoss(torch.nn.Module):
    def __init__(
        self,
        beta: float = 0.04,
        compiled: bool = True,
        use_ref_model: bool = True,
        chunk_size: int = 1,
        epsilon_low: float = 0.2,
        epsilon_high: float = 0.2,
        loss_type: str = "dapo",
        max_completion_length: Optional[int] = None,
        importance_sampling_level: str = "token",
        sapo_temperature_pos: float = 1.0,
        sapo_temperature_neg: float = 1.05,
        temperature: float = 1.0,
        delta: Optional[float] = None,
        use_bias_correction_kl: bool = False,
        vespo_k_pos: float = 2.0,
        vespo_lambda_pos: float = 3.0,
        vespo_k_neg: float = 3.0,
        vespo_lambda_neg: float = 2.0,
        entropy_coef: float = 0.0,
        top_entropy_quantile: float = 1.0,
        backend: Backend = "auto",
        workspace_bytes: Optional[int] = None,
        process_group: Optional[object] = None,
    ):
        """`process_group`: the group over which `lin_weight` (and `bias`) hold vocabulary shards, when they are
        this rank's rows of the head (a DTensor head sharded on dim 0 needs none)."""
        super().__init__()
        self.config = GRPOLossConfig(
            loss_type=loss_type, beta=beta, epsilon=epsilon_low, epsilon_high=epsilon_high, delta=delta,
            importance_sampling_level=importance_sampling_level, temperature=temperature,
            max_completion_length=max_completion_length, use_bias_correction_kl=use_bias_correction_kl,
            sapo_temperature_pos=sapo_temperature_pos, sapo_temperature_neg=sapo_temperature_neg,
            vespo_k_pos=vespo_k_pos, vespo_lambda_pos=vespo_lambda_pos, vespo_k_neg=vespo_k_neg,
            vespo_lambda_neg=vespo_lambda_neg, entropy_coef=entropy_coef, top_entropy_quantile=top_entropy_quantile,
        )
        self.use_ref_model = use_ref_model
        self.backend = backend
        self.workspace_bytes = workspace_bytes  # the GEMM path's logits workspace (None: 1 GiB)
        self.process_group = process_group

    def forward(
        self,
        _input: torch.Tensor,
        lin_weight: torch.Tensor,
        selected_token_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        advantages: torch.Tensor,
        bias: Optional[torch.Tensor] = None,
        ref_per_token_logps: Optional[torch.Tensor] = None,
        old_per_token_logps: Optional[torch.Tensor] = None,
        ref_input: Optional[torch.Tensor] = None,
        ref_weight: Optional[torch.Tensor] = None,
        ref_bias: Optional[torch.Tensor] = None,
        vllm_is_ratio: Optional[torch.Tensor] = None,
        num_items_in_batch: Optional[torch.Tensor] = None,
        kept_token_ids: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Returns (loss, [kl if beta != 0, clip_ratio]) as Liger does. `kept_token_ids` [B, T, K]: the sampler's
        kept-token sets (see `fused_linear_grpo_loss`); reference log-probs computed here use them too."""
        if not isinstance(selected_token_ids, torch.Tensor) or selected_token_ids.dim() != 2:
            raise ValueError("selected_token_ids must be a [B, T] tensor")
        B, T = selected_token_ids.shape
        # Liger documents _input as [B*T, H]; TRL passes [B, T, H]. Accept both.
        hidden = _input.view(B, T, -1) if _input.dim() == 2 else _input
        if self.config.beta != 0.0 and ref_per_token_logps is None:
            if not (self.use_ref_model and ref_input is not None):
                raise ValueError("beta != 0 needs ref_per_token_logps, or use_ref_model=True with ref_input/ref_weight")
            with torch.no_grad():
                ref_hidden = ref_input.view(B, T, -1) if ref_input.dim() == 2 else ref_input
                ref_per_token_logps = linear_logprobs(
                    ref_hidden, ref_weight if ref_weight is not None else lin_weight, selected_token_ids,
                    bias=ref_bias, temperature=self.config.temperature, backend=self.backend,
                    mask=attention_mask, workspace_bytes=self.workspace_bytes, process_group=self.process_group,
                    kept_token_ids=kept_token_ids)
        out = fused_linear_grpo_loss(
            hidden, lin_weight, selected_token_ids, attention_mask, advantages, bias=bias,
            old_logps=old_per_token_logps, ref_logps=ref_per_token_logps, importance_ratio=vllm_is_ratio,
            num_items_in_batch=num_items_in_batch, config=self.config, backend=self.backend,
            workspace_bytes=self.workspace_bytes, process_group=self.process_group, kept_token_ids=kept_token_ids)
        metrics = [out.metrics["kl"]] if self.config.beta != 0.0 else []
        if self.config.loss_type in ("sapo", "vespo"):
            # Liger reports no clipping for the soft-gated (sapo) and gamma-weighted (vespo) objectives: a 0
            metrics.append(torch.zeros((), device=out.loss.device))
        else:
            metrics.append(out.metrics["clip_ratio/region_mean"])
        return out.loss, metrics
