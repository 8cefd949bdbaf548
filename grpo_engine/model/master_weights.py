"""AdamW over float32 master copies of 16-bit trained weights (`optim.master_weights`).

torch's AdamW keeps its moments in the parameters' dtype and adds each step to the weight there: in bfloat16 (the
engine's `model.dtype` on CUDA) a weight near 0.02 is spaced 1.2e-4 from the next, so a step of about the learning
rate (1e-6 by default) rounds back to the same weight. Measured on the demo model in bfloat16: 2.3% of the weights
moved in two steps at lr 1e-6 (grpo_engine/model/update_precision.py). Here each 16-bit parameter has a float32
copy in the optimizer's state; AdamW's step (its moments float32 too) goes into the copy, which is rounded into the
model's weight after the step, so steps smaller than the weight's spacing add up until they move it. The copies
are optimizer state: saved with it in every checkpoint and restored on resume in float32 (torch's load_state_dict
casts state to the parameters' dtype, which would round them back).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Callable, Iterable, Optional

import torch

MASTER = "master"  # the optimizer-state key of a parameter's float32 copy
_FLOAT32_STATE = (MASTER, "exp_avg", "exp_avg_sq")


def needs_master_weights(setting: str, parameters: Iterable[torch.Tensor]) -> bool:
    """Whether `optim.master_weights` gives the trained `parameters` float32 copies: 'float32' always, 'auto' when
    any of them is a floating-point type narrower than float32, 'none' never."""
    if setting == "none":
        return False
    return setting == "float32" or any(p.is_floating_point() and torch.finfo(p.dtype).bits < 32 for p in parameters)


def trained_weights_adamw(setting: str, parameters: list[torch.Tensor], lr: float,
                          betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                          weight_decay: float = 0.0) -> torch.optim.AdamW:
    """The engine's optimizer for `parameters` under `optim.master_weights` `setting`: MasterWeightAdamW where
    needs_master_weights says so, else torch's AdamW."""
    adamw = MasterWeightAdamW if needs_master_weights(setting, parameters) else torch.optim.AdamW
    return adamw(parameters, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


class MasterWeightAdamW(torch.optim.AdamW):
    """torch's AdamW (decoupled weight decay, bias-corrected moments), its arithmetic in float32 on a float32 copy
    of each parameter; the parameter gets the copy rounded to its own dtype after each step."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=False)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            # Parameters at the same step count and of one tensor type, stepped by foreach ops (one dispatch per
            # op for the whole list: FSDP's and TP's DTensors pay Python dispatch per call; a list may not mix
            # DTensors with the plain tensors TP leaves replicated); each op is torch's AdamW's, in its order.
            buckets: dict[tuple[float, type], list[torch.Tensor]] = defaultdict(list)
            for p in group["params"]:
                if p.grad is not None:
                    state = self._state_of(p)
                    state["step"] += 1
                    buckets[float(state["step"]), type(p.data)].append(p)
            for (step, _), params in buckets.items():
                self._step_float32(params, step, group)
        return loss

    def _step_float32(self, params: list[torch.Tensor], step: float, group: dict[str, Any]) -> None:
        lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        masters = [self.state[p][MASTER] for p in params]
        avgs = [self.state[p]["exp_avg"] for p in params]
        squares = [self.state[p]["exp_avg_sq"] for p in params]
        grads = [p.grad.float() for p in params]
        if decay:
            torch._foreach_mul_(masters, 1 - lr * decay)
        torch._foreach_lerp_(avgs, grads, 1 - beta1)
        torch._foreach_mul_(squares, beta2)
        torch._foreach_addcmul_(squares, grads, grads, 1 - beta2)
        denominators = torch._foreach_sqrt(squares)
        torch._foreach_div_(denominators, math.sqrt(1 - beta2 ** step))
        torch._foreach_add_(denominators, eps)
        torch._foreach_addcdiv_(masters, avgs, denominators, -lr / (1 - beta1 ** step))
        for p, master in zip(params, masters):
            p.copy_(master)

    def _state_of(self, p: torch.Tensor) -> dict[str, Any]:
        state = self.state[p]
        if MASTER not in state:  # the first step, or a state saved without copies (optim.master_weights none)
            state[MASTER] = p.detach().to(torch.float32, copy=True)
        for key in ("exp_avg", "exp_avg_sq"):
            if key not in state:
                state[key] = torch.zeros_like(state[MASTER])
        state.setdefault("step", torch.tensor(0.0))
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's, then the float32 entries put back as saved (torch's cast them to the parameters' dtype)."""
        saved = state_dict["state"]
        super().load_state_dict(state_dict)
        indices = [index for group in state_dict["param_groups"] for index in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        for index, p in zip(indices, params):
            for key in _FLOAT32_STATE:
                value = saved.get(index, {}).get(key)
                if isinstance(value, torch.Tensor):
                    self.state[p][key] = value.to(device=p.device, dtype=torch.float32, copy=True)
