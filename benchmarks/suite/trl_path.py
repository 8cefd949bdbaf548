"""TRL 1.16's GRPOTrainer on the benchmark's inputs: its fused LM head and its own `_compute_loss`.

Since TRL 1.15 a GRPOTrainer never materialises logits: `add_fused_lm_head` makes `model(..., labels=...,
fused_lm_head=True)` run `trl.kernels.chunked_logprob.ChunkedLogProbFunction`, which projects [4096 tokens,
32768 vocabulary] tiles in the compute dtype, folds each tile with a Triton kernel (torch ops where Triton does
not run, e.g. on a CPU), recomputes the tiles in the backward and accumulates dH and dW in float32.

What is timed is what a TRL user's training step runs from the last hidden state on: TRL's own
`GRPOTrainer._compute_loss` (its log-prob call, per-token loss, aggregation and logged metrics) on a model whose
backbone hands back the case's hidden states, patched by TRL's `add_fused_lm_head` with the arguments
GRPOTrainer passes. The trainer is a stand-in holding the attributes those methods read, set from the case's
GRPOLossConfig as `GRPOTrainer.__init__` sets them from a GRPOConfig (whose option names GRPOLossConfig shares):
one process, no gradient accumulation, no vLLM, no MoE auxiliary loss.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import fields
from types import SimpleNamespace
from typing import Callable, Optional

import torch
from accelerate import Accelerator
from transformers import PretrainedConfig
from transformers.modeling_outputs import BaseModelOutput
from trl import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

from grpo_kernels import GRPOLossConfig

# GRPOTrainer patches the policy to return entropies too (its metrics, entropy mask and bonus read them) and
# the reference model with the default, log-probs only.
POLICY_OUTPUTS = ("log_probs", "entropy")
REFERENCE_OUTPUTS = ("log_probs",)


class _GivenHiddenStates(torch.nn.Module):
    """A backbone whose output is fixed: `hidden` [B, T, H] at the positions that predict the T completion tokens
    of a one-token prompt, and a zero row at the last position, which predicts nothing (TRL drops it)."""

    def __init__(self, hidden: torch.Tensor):
        super().__init__()
        self.hidden = hidden

    def forward(self, input_ids: torch.Tensor, **unused_model_kwargs) -> BaseModelOutput:
        batch, seq_len, width = self.hidden.shape
        if tuple(input_ids.shape) != (batch, seq_len + 1):
            raise ValueError(f"input_ids must be [B, 1 + T] = [{batch}, {seq_len + 1}] (a one-token prompt and the "
                             f"completion), got {list(input_ids.shape)}")
        pad = self.hidden.new_zeros(batch, 1, width)
        return BaseModelOutput(last_hidden_state=torch.cat([self.hidden, pad], dim=1))


class HeadOnlyCausalLM(torch.nn.Module):
    """A causal LM reduced to its LM head: `add_fused_lm_head` patches it as it patches a transformers model (it
    looks up `base_model`, `get_output_embeddings()` and `config.get_text_config()`). The weight is passed as is,
    so a detached weight is a frozen head, as under LoRA."""

    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor):
        super().__init__()
        self.config = PretrainedConfig()  # no final_logit_softcapping or logit scale: logits = h W^T
        self.base_model = _GivenHiddenStates(hidden)
        self._lm_head = SimpleNamespace(weight=weight, bias=None)

    def get_output_embeddings(self) -> SimpleNamespace:
        return self._lm_head


@functools.lru_cache(maxsize=1)
def _accelerator() -> Accelerator:
    # mixed_precision "no": the inputs already are in the compute dtype, which is what TRL's head then uses.
    return Accelerator()


class GRPOTrainerStandIn:
    """The GRPOTrainer attributes `_compute_loss` and `_get_per_token_logps_and_entropies` read, and TRL's own
    methods, unchanged."""

    _compute_loss = GRPOTrainer._compute_loss
    _get_per_token_logps_and_entropies = GRPOTrainer._get_per_token_logps_and_entropies
    get_high_entropy_mask = GRPOTrainer.get_high_entropy_mask
    get_off_policy_mask = staticmethod(GRPOTrainer.get_off_policy_mask)
    get_gamma_weights = staticmethod(GRPOTrainer.get_gamma_weights)

    def __init__(self, config: GRPOLossConfig, model: torch.nn.Module):
        self.args = SimpleNamespace(**{f.name: getattr(config, f.name) for f in fields(config)},
                                    steps_per_generation=1)
        self.model = model  # its `.training` selects the train-mode normalisers
        self.accelerator = _accelerator()
        self.current_gradient_accumulation_steps = 1
        self.loss_type = config.loss_type
        self.beta = config.beta
        self.epsilon_low = config.epsilon_low
        self.epsilon_high = config.epsilon_high_value
        self.temperature = config.temperature
        self.importance_sampling_level = config.importance_sampling_level
        self.max_completion_length = config.max_completion_length
        self.top_entropy_quantile = config.top_entropy_quantile
        self.entropy_coef = config.entropy_coef
        self.use_adaptive_entropy = False
        self._entropy_bonus_enabled = config.entropy_coef != 0.0
        self.off_policy_mask_threshold = None
        self.aux_loss_enabled = False
        self.use_vllm = False
        self.vllm_importance_sampling_correction = False
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}


def _prompt(completion_ids: torch.Tensor) -> torch.Tensor:
    return completion_ids.new_zeros(completion_ids.shape[0], 1)


def _patched_model(hidden: torch.Tensor, weight: torch.Tensor, temperature: float,
                   outputs: tuple[str, ...]) -> HeadOnlyCausalLM:
    model = HeadOnlyCausalLM(hidden, weight)
    add_fused_lm_head(model, temperature=temperature, outputs=outputs)  # as GRPOTrainer.__init__ calls it
    return model


def loss_step(hidden: torch.Tensor, weight: torch.Tensor, completion_ids: torch.Tensor,
              completion_mask: torch.Tensor, advantages: torch.Tensor, config: GRPOLossConfig,
              old_logps: Optional[torch.Tensor], ref_logps: Optional[torch.Tensor],
              leaves: tuple[torch.Tensor, ...]) -> Callable[[], tuple[torch.Tensor, ...]]:
    """TRL's `_compute_loss` forward + backward; the step returns the gradients w.r.t. `leaves`.

    old_logps None: on-policy (TRL then uses the detached current log-probs). ref_logps is read when beta != 0.
    """
    model = _patched_model(hidden, weight, config.temperature, POLICY_OUTPUTS)
    trainer = GRPOTrainerStandIn(config, model)
    prompt = _prompt(completion_ids)
    batch = {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": completion_ids,
             "completion_mask": completion_mask, "advantages": advantages,
             # as _generate_and_score_completions: the valid tokens of the (one-process) generation batch
             "num_items_in_batch": completion_mask.sum()}
    if old_logps is not None:
        batch["old_per_token_logps"] = old_logps
    if ref_logps is not None:
        batch["ref_per_token_logps"] = ref_logps

    def step():
        loss = trainer._compute_loss(model, batch)
        return torch.autograd.grad(loss, leaves)
    return step


def logprobs_step(hidden: torch.Tensor, weight: torch.Tensor, completion_ids: torch.Tensor,
                  temperature: float = 1.0) -> Callable[[], torch.Tensor]:
    """No-grad per-token log-probs of every completion position, as GRPOTrainer computes reference log-probs."""
    model = _patched_model(hidden, weight, temperature, REFERENCE_OUTPUTS)
    trainer = GRPOTrainerStandIn(GRPOLossConfig(temperature=temperature), model)
    input_ids = torch.cat([_prompt(completion_ids), completion_ids], dim=1)
    attention_mask = torch.ones_like(input_ids)

    def step():
        with torch.no_grad():
            logps, _entropies, _aux = trainer._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, completion_ids.shape[1])
        return logps
    return step
