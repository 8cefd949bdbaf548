"""Hooks and forwards around the LM head, which the fused kernels never call.

The kernels read `lm_head.weight` (and `bias`) and compute `h @ weight.T + bias` themselves, so whatever runs around
`lm_head(...)` does not run: found by probing, a forward hook that changes the logits, a forward pre-hook that
changes the hidden states, a forward set on the instance, and a pre-hook that recomputes the weight before each call
(the old `torch.nn.utils.weight_norm`, pruning: the weight read is then stale) all gave log-probs of logits the model
never computes, without an error. They are refused by name; the hooks of the engines that only gather or move the
weight, which the integration does itself, are kept.
"""

from __future__ import annotations

from torch import nn

# Owners of hooks and instance forwards the fused head may leave uncalled: they gather, shard or move the head's
# weight (DeepSpeed ZeRO-3, FSDP2, accelerate's device placement), which sharding.call_with_full_head and run_head do
# themselves; mark tensors as needing a gradient (transformers' enable_input_require_grads, on a head tied as the
# embedding); or are TRL's: its cast_lm_head_to_fp32 forward (the integration computes in float32 then, lm_head_fp32)
# and its activation offloading's hooks (they only turn offloading off around the head).
TRUSTED_OWNERS = ("deepspeed.", "torch.distributed.", "accelerate.", "transformers.", "trl.")
# Packages the user named with trust_head_hooks: another framework whose hooks only gather, move or cast the weight
_trusted_by_user: list[str] = []


def trust_head_hooks(*packages: str) -> None:
    """Keep the hooks and instance forwards on an LM head that `packages` (and their submodules) define: for a
    framework whose hooks only gather, shard, move or cast the head's weight, as DeepSpeed's and FSDP2's do, which
    grpo_kernels does itself. Without it such a hook is refused, since a hook that changes the logits or the hidden
    states would not run under the fused head."""
    for package in packages:
        if not isinstance(package, str) or not all(part.isidentifier() for part in package.split(".")):
            raise ValueError(f"trust_head_hooks: expected a package's dotted name (e.g. 'colossalai'), got "
                             f"{package!r:.80}")
    _trusted_by_user.extend(f"{package}." for package in packages if f"{package}." not in _trusted_by_user)
_HOOK_KINDS = {"_forward_pre_hooks": "forward pre-", "_forward_hooks": "forward ",
               "_backward_pre_hooks": "backward pre-", "_backward_hooks": "backward "}


def _owner(hook: object) -> str:
    """The module that defined `hook` (a function, a bound method, a partial, or a callable object's class)."""
    hook = getattr(hook, "func", hook)  # functools.partial (accelerate's forward: its __module__ is the head's)
    return str(getattr(hook, "__module__", None) or type(hook).__module__)


def _trusted(hook: object) -> bool:
    return f"{_owner(hook)}.".startswith((*TRUSTED_OWNERS, *_trusted_by_user))


def _trust_advice(hook: object) -> str:
    package = _owner(hook).split(".")[0]
    return (f"; a framework's hook that only gathers, moves or casts the weight is kept once its package is named: "
            f"grpo_kernels.integrations.trust_head_hooks({package!r})") if package not in ("__main__", "") else ""


def _shown(hook: object) -> str:
    return getattr(getattr(hook, "func", hook), "__qualname__", type(hook).__name__)


def refuse_bypassed_hooks(head: nn.Module) -> None:
    """A forward set on the instance, or a forward / backward hook, that is not a trusted owner's (see above)."""
    name = type(head).__name__
    forward = vars(head).get("forward")
    accelerate_hook = getattr(head, "_hf_hook", None)  # accelerate's forward runs these (a SequentialHook: several)
    around = [forward, *(getattr(accelerate_hook, "hooks", None) or [accelerate_hook])] if forward is not None else []
    for hook in around:
        if hook is not None and not _trusted(hook):
            raise TypeError(f"the LM head {name} has its forward replaced on the instance ({_shown(hook):.60}), which "
                            "grpo_kernels would not call (it computes lm_head.weight @ h + lm_head.bias): restore it "
                            f"(del lm_head.forward){_trust_advice(hook)}")
    for attribute, kind in _HOOK_KINDS.items():
        for hook in getattr(head, attribute, {}).values():
            if not _trusted(hook):
                raise TypeError(f"the LM head {name} has a {kind}hook ({_shown(hook):.60}), which grpo_kernels would "
                                "not run (it reads lm_head.weight without calling lm_head): remove it; a weight it "
                                "recomputes belongs in a parametrization (torch.nn.utils.parametrize)"
                                f"{_trust_advice(hook)}")
