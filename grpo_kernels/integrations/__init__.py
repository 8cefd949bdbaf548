"""One-line switches to the fused kernels for existing training code.

* `grpo_kernels.integrations.transformers.patch_causal_lm(model)`: a transformers causal LM whose forward
  returns per-token log-probs / entropies (`return_logprobs=True`) instead of logits.
* `grpo_kernels.integrations.trl.GRPOKernelsTrainer` / `patch_grpo_trainer(trainer)`: TRL's GRPOTrainer with
  its log-probs, loss and metrics from the fused kernels (needs TRL, imported only from that module).
"""

from .transformers import CausalLMLogprobsOutput, is_patched, patch_causal_lm, unpatch_causal_lm

__all__ = ["CausalLMLogprobsOutput", "is_patched", "patch_causal_lm", "unpatch_causal_lm"]
