"""`loss.params`: the hyper-parameters a registered loss type declares, checked against its declaration.

A loss type declares its own hyper-parameters as {name: default} (the registry's `LossType.params`; the
built-in types declare none). The config carries every declared one, defaults filled in, so that they are
saved with the run and logged; a key the type does not declare, or a value of another type than its
default's, is refused naming `loss.params.KEY`.
"""

from __future__ import annotations

import difflib
import math
from typing import Any, Mapping

from grpo_kernels.losses import get_loss_type, validate_loss_params


def declared_loss_params(loss_type: str) -> Mapping[str, Any]:
    """{name: default} of the hyper-parameters `loss_type` declares (empty when it declares none): the defaults of
    its `register_loss_type(params={name: LossParam(...)})`."""
    declared = getattr(get_loss_type(loss_type), "params", None) or {}
    return {name: getattr(param, "default", param) for name, param in declared.items()}


def _same_kind(value: Any, default: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, type(default))


def check_loss_params(loss_type: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The declared hyper-parameters with `params` set over their defaults; ValueError naming the key."""
    declared = declared_loss_params(loss_type)
    for name, value in params.items():
        if name not in declared:
            close = difflib.get_close_matches(str(name), list(declared), n=1, cutoff=0.6)
            hint = f" (did you mean loss.params.{close[0]}?)" if close else (
                f" (it declares: {', '.join(declared)})" if declared else " (it declares none)")
            raise ValueError(f"loss.params.{name}: not a hyper-parameter of loss type {loss_type!r}{hint}")
        default = declared[name]
        if not _same_kind(value, default):
            kind = "a finite number" if isinstance(default, float) else type(default).__name__
            raise ValueError(f"loss.params.{name}: expected {kind} (its default is {default!r}), got {value!r}")
    filled = {name: params.get(name, default) for name, default in declared.items()}
    filled = {name: float(value) if isinstance(declared[name], float) else value for name, value in filled.items()}
    if getattr(get_loss_type(loss_type), "params", None):  # the kernels' own check: bounds and choices too
        filled = validate_loss_params(loss_type, filled, key="loss.params")
    return filled
