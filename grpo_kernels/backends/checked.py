"""A registered (user) backend held to the Protocol (protocol.py) at each call, as a registered loss type's term is
held to its own (objective.run_term): its results are refused, naming the backend, unless they are what the rest of
the library computes with, and an error raised inside it says which backend raised it.

Without this, a plugin's slip surfaced far from it: a [N, 1] or a short result failed in a reshape or a broadcast
inside torch, a view of an input in the custom op's aliasing check, a missing gradient silently left `.grad`
None (nothing trained), and NaN statistics or log-probs above 0 (a negative log-likelihood returned for a log-prob)
gave a NaN or a wrong loss without a word. The package's own backends are checked by the conformance tests, once,
and run unwrapped: nothing here costs them anything.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch

from .protocol import stats_dtype

# A log-prob of a target inside the head may exceed 0 by rounding only: log-sum-exp and the target's logit come
# from the same float32 logits, off by a few ulps of |lse|.
LOGP_SLACK = 1e-4


def _shown_result(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).removeprefix('torch.')} {list(x.shape)} on {x.device}"
    return type(x).__name__


class CheckedBackend:
    """`inner` (the object a registered spec's module made) behind the Protocol's checks; any other attribute
    (a token-level route's method, the sequence-wave store) is the inner one, its errors annotated."""

    def __init__(self, inner: Any, name: str) -> None:
        self._inner, self._name = inner, name

    def __getattr__(self, attribute: str) -> Any:
        value = getattr(self._inner, attribute)
        return self._annotated(attribute, value) if callable(value) else value

    def _annotated(self, method: str, function: Callable) -> Callable:
        def call(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except Exception as exc:
                exc.add_note(f"in {method} of backend {self._name!r} (register_backend)")
                raise
        return call

    def _refuse(self, method: str, problem: str, error: type = ValueError) -> None:
        raise error(f"backend {self._name!r}: its {method} {problem}")

    def _tensors(self, method: str, result: object, names: tuple[str, ...]) -> tuple:
        if not isinstance(result, (tuple, list)) or len(result) != len(names):
            count = f" of {len(result)}" if isinstance(result, (tuple, list)) else ""
            self._refuse(method, f"returned {_shown_result(result)}{count}, expected the {len(names)}-tuple "
                                 f"({', '.join(names)})", TypeError)
        return tuple(result)

    def _same_memory(self, x: torch.Tensor, inputs: tuple[Optional[torch.Tensor], ...]) -> bool:
        if x.numel() == 0:
            return False
        pointer = x.untyped_storage().data_ptr()
        return any(t is not None and t.numel() and t.untyped_storage().data_ptr() == pointer for t in inputs)

    def _check_tensor(self, method: str, name: str, x: object, shape: tuple[int, ...], dtype: Optional[torch.dtype],
                      device: torch.device, inputs: tuple[Optional[torch.Tensor], ...]) -> None:
        kind = "" if dtype is None else " " + str(dtype).removeprefix("torch.")
        expected = f"[{', '.join(str(d) for d in shape)}]{kind} on {device}"
        if not isinstance(x, torch.Tensor):
            self._refuse(method, f"returned {_shown_result(x)} for {name}, expected a tensor {expected}", TypeError)
        if tuple(x.shape) != shape or (dtype is not None and x.dtype != dtype) or x.device != device:
            self._refuse(method, f"returned {name} as {_shown_result(x)}, expected {expected}")
        if self._same_memory(x, inputs):
            self._refuse(method, f"returned {name} in the memory of one of its inputs; return a new tensor")

    def linear_forward(self, hidden: torch.Tensor, head: Any, targets: torch.Tensor):
        method = "linear_forward"
        result = self._tensors(method, self._annotated(method, self._inner.linear_forward)(hidden, head, targets),
                               ("logps", "entropy", "lse"))
        inputs = (hidden, head.weight, head.bias, targets)
        for name, x in zip(("logps", "entropy", "lse"), result):
            self._check_tensor(method, name, x, (hidden.shape[0],), stats_dtype(hidden.dtype), hidden.device, inputs)
        if not torch.compiler.is_compiling():  # the values: the inputs were checked finite at the boundary
            logps, entropy, lse = result
            inside = (targets >= 0) & (targets < head.weight.shape[0])
            slack = LOGP_SLACK * (1 + lse.abs())
            # An entropy is of a softmax over the head's V rows (this shard's, for a sharded head): in [0, log V].
            # Outside it (a negated or a summed-not-averaged entropy) the entropy metric and the entropy bonus's
            # gradient were wrong without a word, as a log-prob above 0 was.
            log_vocab = math.log(head.weight.shape[0])
            finite = torch.stack([torch.isfinite(x).all() for x in result])
            above = (inside & (logps > slack)).any()
            outside = ((entropy < -slack) | (entropy > log_vocab + slack)).any()
            finite, above, outside = finite.tolist(), bool(above), bool(outside)
            for name, ok in zip(("logps", "entropy", "lse"), finite):
                if not ok:
                    self._refuse(method, f"returned NaN or infinite {name} from finite inputs")
            if above:
                self._refuse(method, "returned log-probs above 0 (a log-probability is at most 0; a negative "
                                     "log-likelihood has the opposite sign)")
            if outside:
                self._refuse(method, f"returned entropies outside [0, log V] = [0, {log_vocab:.4g}] (V = "
                                     f"{head.weight.shape[0]} head rows: the entropy of a softmax over them)")
        return result

    def linear_backward(self, grad_logps: torch.Tensor, grad_entropy: Optional[torch.Tensor], hidden: torch.Tensor,
                        head: Any, targets: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor,
                        needs_hidden_grad: bool = True, needs_weight_grad: bool = True):
        method = "linear_backward"
        names = ("dhidden", "dweight", "dbias")
        result = self._tensors(method, self._annotated(method, self._inner.linear_backward)(
            grad_logps, grad_entropy, hidden, head, targets, lse, entropy, needs_hidden_grad=needs_hidden_grad,
            needs_weight_grad=needs_weight_grad), names)
        needed = (needs_hidden_grad, needs_weight_grad, needs_weight_grad and head.bias is not None)
        inputs = (hidden, head.weight, head.bias, targets, grad_logps, grad_entropy, lse, entropy)
        for name, x, like, need in zip(names, result, (hidden, head.weight, head.bias), needed):
            if x is None:
                if need:
                    self._refuse(method, f"returned None for {name}, which the call needs (needs_"
                                         f"{'hidden' if name == 'dhidden' else 'weight'}_grad=True): the input would "
                                         "silently get no gradient")
                continue
            if like is not None:
                self._check_tensor(method, name, x, tuple(like.shape), None, like.device, inputs)
        computed = [x for x in result if x is not None]
        if computed and not torch.compiler.is_compiling():
            upstream = [x for x in (grad_logps, grad_entropy) if x is not None]
            flags = torch.stack([torch.isfinite(x).all() for x in (*upstream, *computed)]).tolist()
            if all(flags[:len(upstream)]) and not all(flags[len(upstream):]):
                self._refuse(method, "returned NaN or infinite gradients from finite inputs and upstream gradients")
        return result
