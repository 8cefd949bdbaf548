"""Switch TRL's GRPOTrainer to the fused kernels in one line.

    from grpo_kernels.integrations.trl import GRPOKernelsTrainer    # instead of trl.GRPOTrainer
    trainer = GRPOKernelsTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...)

or, for an existing trainer (or class): `patch_grpo_trainer(trainer)`.

Two seams of TRL are replaced:
* `_get_per_token_logps_and_entropies` (old, reference and policy log-probs): the backbone runs, then
  `grpo_kernels.linear_logprobs` streams the LM head over the completion positions.
* `_compute_loss`: `grpo_kernels.fused_linear_grpo_loss` on the last hidden state and `lm_head.weight`, inside
  the model's forward (so FSDP / ZeRO-3 see the head where they expect it), with TRL's scaling and metrics.
  The few configurations whose arithmetic only TRL's own code reproduces (trl_loss.fused_path_blocker) run
  TRL's `_compute_loss` on the kernels' log-probs and entropies instead.

Multimodal and MoE-aux-loss batches keep TRL's own log-prob path. Supported TRL: SUPPORTED_TRL_VERSIONS.
"""

from __future__ import annotations

import logging
import types
from typing import Any, Optional, Union

import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ..backends import check_backend_name
from .lm_head import output_head
from .transformers import check_backend_serves, head_logit_transform, patch_causal_lm
from .wrappers import causal_lm
from .trl_loss import fused_compute_loss, fused_path_blocker

# The seams above are TRL internals: only versions whose `_compute_loss` was checked line by line are accepted.
SUPPORTED_TRL_VERSIONS = SpecifierSet(">=1.16.0,<1.17")

logger = logging.getLogger(__name__)


def check_trl_version(version: Optional[str] = None) -> None:
    """Raise ImportError unless the installed (or given) TRL version is one this integration supports."""
    if version is None:
        try:
            import trl
        except ImportError as error:
            raise ImportError("grpo_kernels.integrations.trl needs TRL: pip install 'trl>=1.16,<1.17'") from error
        version = trl.__version__
    if Version(version) not in SUPPORTED_TRL_VERSIONS:
        raise ImportError(
            f"grpo_kernels.integrations.trl supports trl{SUPPORTED_TRL_VERSIONS}, found trl=={version}: it "
            "replaces GRPOTrainer internals (_compute_loss, _get_per_token_logps_and_entropies) that change "
            "between TRL releases. Install a supported TRL (pip install 'trl>=1.16,<1.17')."
        )


check_trl_version()

from trl import GRPOTrainer  # noqa: E402  (after the version check, which gives the clearer error)

_BACKEND_ATTR = "_grpo_kernels_backend"
_ORIGINALS_ATTR = "_grpo_kernels_original_methods"
_REPORTED_ATTR = "_grpo_kernels_reported_blockers"


def _inner_model(trainer: Any, model: torch.nn.Module) -> torch.nn.Module:
    """The *ForCausalLM inside the accelerator / PEFT wrappers of `model`."""
    inner = trainer.accelerator.unwrap_model(model)
    if hasattr(inner, "get_base_model"):  # PEFT: the adapters wrap the causal LM
        inner = inner.get_base_model()
    return inner


def _kernel_model(trainer: Any, model: torch.nn.Module) -> torch.nn.Module:
    """Patch (once) the *ForCausalLM inside the accelerator / PEFT wrappers of `model`."""
    return patch_causal_lm(_inner_model(trainer, model), backend=getattr(trainer, _BACKEND_ATTR),
                           lm_head_fp32=bool(trainer.args.cast_lm_head_to_fp32))


def refuse_unservable_model(trainer: Any, backend: str) -> None:
    """What the first step would refuse, refused when the model is known (patching an instance, building a
    GRPOKernelsTrainer), not after the first generation: a backend that cannot run the model's logit transform, and
    a head the fused path cannot compute (a hook around lm_head, an adapter on it, a quantized weight, ...)."""
    lm = causal_lm(_inner_model(trainer, trainer.model))
    check_backend_serves(lm, backend)
    output_head(lm)


def _original(trainer: Any, name: str):
    return getattr(trainer, _ORIGINALS_ATTR)[name]


def kernel_logps_and_entropies(self: Any, model: torch.nn.Module, input_ids: torch.Tensor,
                               attention_mask: torch.Tensor, logits_to_keep: int, batch_size: Optional[int] = None,
                               compute_entropy: bool = False, compute_aux_loss: bool = False, **multimodal: Any):
    """TRL's `_get_per_token_logps_and_entropies` through `linear_logprobs`: same chunks, shapes and zeros."""
    if compute_aux_loss or any(value is not None for value in multimodal.values()):
        return _original(self, "_get_per_token_logps_and_entropies")(
            self, model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
            compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal)
    _kernel_model(self, model)
    batch_size = batch_size or input_ids.size(0)
    all_logps, all_entropies = [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids, mask = input_ids[start:start + batch_size], attention_mask[start:start + batch_size]
        # As TRL: only completion tokens are scored, padding gives 0.
        labels = ids.masked_fill(mask == 0, -100)
        labels[:, :-logits_to_keep] = -100
        with self.accelerator.autocast():
            out = model(input_ids=ids, attention_mask=mask, labels=labels, return_logprobs=True,
                        return_entropy=compute_entropy, temperature=self.temperature)
        all_logps.append(out.logps[:, -logits_to_keep:])
        if compute_entropy:
            all_entropies.append(out.entropy[:, -logits_to_keep:])
    entropies = torch.cat(all_entropies, dim=0) if compute_entropy else None
    return torch.cat(all_logps, dim=0), entropies, None


def kernel_compute_loss(self: Any, model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    """TRL's `_compute_loss` through `fused_linear_grpo_loss`, or TRL's own code on the kernels' log-probs."""
    blocker = fused_path_blocker(self, inputs)
    if blocker is not None:
        reported = self.__dict__.setdefault(_REPORTED_ATTR, set())
        if blocker not in reported:
            reported.add(blocker)
            logger.info("grpo_kernels: %s; TRL's loss code runs on the kernels' log-probs for these steps", blocker)
        return _original(self, "_compute_loss")(self, model, inputs)
    kernel_model = _kernel_model(self, model)
    return fused_compute_loss(self, model, inputs, backend=getattr(self, _BACKEND_ATTR),
                              logit_transform=head_logit_transform(kernel_model))


_REPLACEMENTS = {
    "_compute_loss": kernel_compute_loss,
    "_get_per_token_logps_and_entropies": kernel_logps_and_entropies,
}


def _unpatched_method(cls: type, name: str):
    method = getattr(cls, name)
    if method is _REPLACEMENTS[name]:  # already a kernels class (e.g. GRPOKernelsTrainer): keep its originals
        return getattr(cls, _ORIGINALS_ATTR)[name]
    return method


def patch_grpo_trainer(trainer_or_class: Union[GRPOTrainer, type], backend: str = "auto"):
    """Route a GRPOTrainer instance (or every instance of a GRPOTrainer class) through the fused kernels.

    Returns what it was given. Patching again only changes the backend.
    """
    check_backend_name(backend)  # the registry as it is now: a backend registered after import is taken
    is_class = isinstance(trainer_or_class, type)
    cls = trainer_or_class if is_class else type(trainer_or_class)
    if not issubclass(cls, GRPOTrainer):
        raise TypeError(f"trainer_or_class must be a trl.GRPOTrainer (subclass or instance), got {cls.__name__}")
    if not is_class:  # the model is known
        refuse_unservable_model(trainer_or_class, backend)
    setattr(trainer_or_class, _BACKEND_ATTR, backend)
    if _ORIGINALS_ATTR in vars(trainer_or_class):
        return trainer_or_class
    # The methods in place now (TRL's or a user subclass's) stay reachable for the configurations they keep.
    originals = {name: _unpatched_method(cls, name) for name in _REPLACEMENTS}
    setattr(trainer_or_class, _ORIGINALS_ATTR, originals)
    for name, replacement in _REPLACEMENTS.items():
        setattr(trainer_or_class, name, replacement if is_class else types.MethodType(replacement, trainer_or_class))
    return trainer_or_class


class GRPOKernelsTrainer(GRPOTrainer):
    """`trl.GRPOTrainer` with its log-probs, loss and metrics from the fused kernels.

    Takes GRPOTrainer's arguments, plus `kernel_backend` ("auto": Triton on CUDA, chunked torch elsewhere).
    """

    _grpo_kernels_backend = "auto"
    _grpo_kernels_original_methods = {name: getattr(GRPOTrainer, name) for name in _REPLACEMENTS}
    _compute_loss = kernel_compute_loss
    _get_per_token_logps_and_entropies = kernel_logps_and_entropies

    def __init__(self, *args: Any, kernel_backend: str = "auto", **kwargs: Any) -> None:
        check_backend_name(kernel_backend, "kernel_backend")
        self._grpo_kernels_backend = kernel_backend
        super().__init__(*args, **kwargs)
        refuse_unservable_model(self, kernel_backend)


__all__ = ["GRPOKernelsTrainer", "SUPPORTED_TRL_VERSIONS", "check_trl_version", "patch_grpo_trainer"]
