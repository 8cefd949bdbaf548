"""Whether the trained weights' dtype can hold the optimizer's steps, checked once when the run starts (after the
weights load, before step 1).

torch's AdamW keeps its moments in the parameters' dtype and adds its step to each weight there (with
optim.master_weights none; else grpo_engine/model/master_weights.py steps float32 copies, and only a learning rate
of 0 is said). A step smaller than half the spacing of that dtype's numbers near a weight rounds back to the same weight: in bfloat16 (`model.dtype` auto on CUDA) a weight near 0.02 is spaced 1.2e-4 from
the next, so AdamW's step of about the learning rate (1e-6 by default) changes nothing. Measured on the demo model
in bfloat16: 2.3% of the weights moved in two steps at lr 1e-6, 16% at 1e-5. And AdamW's epsilon, added to the
square root of the second moment in the same dtype, rounds to 0 in float16 (1e-8 is below its smallest number):
the step then divides by 0 wherever a gradient's square underflows, NaN at step 1 whatever the learning rate.

The other end of the same step: AdamW's first step moves every weight a gradient reaches by the learning rate itself
(m / sqrt(v) is the gradient's sign), whatever the gradient's scale. A learning rate larger than most trained weights
(0.1 to 0.5 for full fine-tuning, where a pretrained model's weights are about 0.02) overwrites most of the model in
its first steps: said, measured against the weights themselves (a weight of 0, LoRA's B, has no size to lose).
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
from accelerate import Accelerator

from ..config import ConfigError

_log = logging.getLogger(__name__)  # grpo_engine/messages.py: how the CLI shows it

# Warn when a step of the learning rate rounds away for more than this share of the trained weights: then most of
# the model cannot learn (a share of small weights, biases near 0, always can).
UNCHANGED_SHARE = 0.5
_CHUNK = 1 << 22  # elements compared at once: float64 temporaries stay small for the largest embedding


def _local(parameter: torch.Tensor) -> torch.Tensor:
    return getattr(parameter, "to_local", lambda: parameter)().detach()  # a DTensor's shard: this rank's


def unchanged_weights(parameters: list[torch.Tensor], step: float, steps_dtype: Optional[torch.dtype] = None
                      ) -> tuple[int, int]:
    """(weights that a change of `step` either way rounds back to themselves in their own dtype, or in `steps_dtype`
    where the optimizer steps copies of them in it, weights) of this process's floating-point `parameters`, both
    counted over the weights that are not 0. Any step moves a weight of 0 (LoRA's B, which starts at 0), but what it
    moves is a product with the weights beside it, whose own size decides whether it changes anything: counted,
    LoRA's B made half of a LoRA run's weights "movable" at any learning rate (1e-30 trained nothing, unsaid)."""
    unchanged = total = 0
    for parameter in parameters:
        values = _local(parameter)
        if not values.is_floating_point():
            continue
        for chunk in values.reshape(-1).split(_CHUNK):
            chunk = chunk if steps_dtype is None else chunk.to(steps_dtype)
            # Added in float64 and rounded once, as AdamW's float32 arithmetic does: `chunk + step` in float16
            # would round the step to float16 first (2.37e-7 becomes 2.38e-7, a tie that moves half the weights).
            exact = chunk.double()
            nonzero = chunk != 0
            unchanged += int((((exact + step).to(chunk.dtype) == chunk)
                              & ((exact - step).to(chunk.dtype) == chunk) & nonzero).sum())
            total += int(nonzero.sum())
    return unchanged, total


def outweighed_weights(parameters: list[torch.Tensor], step: float) -> tuple[int, int]:
    """(weights smaller in magnitude than `step` but not 0, weights not 0) of this process's floating-point
    `parameters`: those that one AdamW step of `step` changes by more than their own size."""
    outweighed = nonzero = 0
    for parameter in parameters:
        values = _local(parameter)
        if not values.is_floating_point():
            continue
        for chunk in values.reshape(-1).split(_CHUNK):
            size = chunk.abs().double()
            outweighed += int(((size > 0) & (size < step)).sum())
            nonzero += int((size > 0).sum())
    return outweighed, nonzero


def check_update_precision(accelerator: Accelerator, parameters: list[torch.Tensor], learning_rate: float,
                           adam_epsilon: float, dtype_setting: str, float32_steps: bool = False) -> None:
    """ConfigError when AdamW's epsilon rounds to 0 in a trained weight's dtype; a warning when a step of
    `learning_rate` rounds away for more than UNCHANGED_SHARE of the trained weights, and one when it is larger than
    more than that share of them (over every process). Run on every process (it all-reduces once). `float32_steps`:
    AdamW steps float32 copies of the weights (grpo_engine/model/master_weights.py), which hold any step float32
    does."""
    dtypes = sorted({_local(p).dtype for p in parameters if p.is_floating_point()}, key=str)
    for dtype in [] if float32_steps else dtypes:
        if float(torch.tensor(adam_epsilon, dtype=dtype)) == 0.0:
            raise ConfigError(
                f"optim.adam_epsilon {adam_epsilon:g} rounds to 0 in {_name(dtype)}, the dtype of the trained weights "
                f"and of AdamW's moments (model.dtype {dtype_setting}): AdamW would divide by 0 wherever a "
                f"gradient's square underflows, writing NaN at step 1 whatever the learning rate; use "
                f"optim.master_weights auto (float32 copies of the weights), model.dtype bfloat16 or float32, or "
                f"LoRA (model.lora.enabled: its adapters train in float32)")
    # float32 copies hold any step but one of 0 (or one that float32 itself rounds away: 1e-50 is 0 there)
    steps_dtype = torch.float32 if float32_steps else None
    counts = torch.tensor([*unchanged_weights(parameters, learning_rate, steps_dtype),
                           *outweighed_weights(parameters, learning_rate)], dtype=torch.float64)
    if accelerator.num_processes > 1:  # FSDP / TP shards: each process holds a part of the weights
        counts = accelerator.reduce(counts.to(accelerator.device), "sum").cpu()
    unchanged, total, outweighed, nonzero = counts.tolist()
    if not accelerator.is_main_process:
        return
    if learning_rate == 0 or (total and unchanged > UNCHANGED_SHARE * total):
        shown = [torch.float32] if float32_steps else dtypes
        _log.warning(f"warning: {_unchanged_message(learning_rate, unchanged / max(total, 1), shown, dtype_setting)}")
    if nonzero and outweighed > UNCHANGED_SHARE * nonzero:
        _log.warning(f"warning: optim.learning_rate {learning_rate:g} is larger than {outweighed / nonzero:.0%} of "
                     f"the trained weights themselves: AdamW's first steps move every weight by about the learning "
                     f"rate whatever the gradient's scale, so they overwrite most of the model; use a learning rate "
                     f"well below its weights' size (TRL's default for full fine-tuning is 1e-6)")


def _unchanged_message(learning_rate: float, share: float, dtypes: list[torch.dtype], dtype_setting: str) -> str:
    if learning_rate == 0:
        return "optim.learning_rate is 0: no trained weight can change, so the run samples and scores without training"
    shown = ", ".join(_name(dtype) for dtype in dtypes)
    narrow = any(torch.finfo(dtype).bits < 32 for dtype in dtypes)
    advice = ("use optim.master_weights auto (float32 copies of the weights), model.dtype float32, LoRA "
              "(model.lora.enabled: its adapters train in float32) or a larger optim.learning_rate" if narrow else
              "use a larger optim.learning_rate")
    return (f"a step of optim.learning_rate {learning_rate:g} rounds back to the same weight for {share:.0%} of the "
            f"trained weights that are not 0 ({shown}, model.dtype {dtype_setting}): AdamW moves a weight by about the learning "
            f"rate per step, less than half the spacing of {shown} numbers near those weights, so they never "
            f"change; {advice}")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
