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
            lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self._state_of(p)
                state["step"] += 1
                step = float(state["step"])
                master, avg, avg_sq = state[MASTER], state["exp_avg"], state["exp_avg_sq"]
                grad = p.grad.float()
                master.mul_(1 - lr * decay)
                avg.lerp_(grad, 1 - beta1)
                avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (avg_sq.sqrt() / math.sqrt(1 - beta2 ** step)).add_(eps)
                master.addcdiv_(avg, denom, value=-lr / (1 - beta1 ** step))
                p.copy_(master)
        return loss

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
