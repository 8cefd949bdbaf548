"""What the fused backwards can and cannot be asked by autograd: no second-order gradients, no forward-mode tangents,
a graph kept for another backward (retain_graph=True) must find its saved tensors unchanged, and what
torch.use_deterministic_algorithms asks of a backend that is not bitwise repeatable.

The fused backwards (the GEMM path, the Triton kernels, the chunked torch code) compute dLoss/dhidden and
dLoss/dW from the softmax statistics in opaque passes that have no derivative of their own. A backward asked
to build a graph (`torch.autograd.grad(..., create_graph=True)`, a gradient penalty) would hand back a gradient
whose own gradient is silently missing; it is refused instead, on every fused backend, with this message.
"""

from __future__ import annotations

import torch
from torch.autograd import forward_ad

from .backends import AUTO, BACKENDS
from .config import warn_at_caller

SECOND_ORDER_MESSAGE = (
    "grpo_kernels: a second-order gradient (backward or autograd.grad with create_graph=True) through the "
    "fused LM-head loss is not supported on backend={backend!r}: its backward is a fused pass with no derivative "
    "of its own, so the second-order term would silently be 0. backend={exact} (plain torch autograd over "
    "the materialised [tokens, vocab] logits) differentiates twice exactly; or detach the loss's inputs from the "
    "graph you differentiate twice")


def refuse_second_order(backend: str) -> None:
    """Raise when the backward running now was asked for a graph of its own (create_graph=True): autograd runs
    a backward with grad mode on exactly then. Compiled graphs are traced, not differentiated twice."""
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        exact = " or ".join(repr(name) for name, spec in BACKENDS.items() if spec.second_order)
        raise RuntimeError(SECOND_ORDER_MESSAGE.format(backend=backend, exact=exact))


def graph_is_kept() -> bool:
    """Whether the backward running now keeps its graph for another one (retain_graph=True): then the tensors it
    saved must stay as they were. Unknown (an older torch without the query) counts as kept: the safe answer."""
    query = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return True if query is None else bool(query())


# ---- forward-mode AD: a dual tensor's tangent ----------------------------------------------------------------

def refuse_forward_ad(backend: str, **named: object) -> None:
    """A forward-mode AD tangent (torch.autograd.forward_ad.make_dual) on an input: only a backend whose gradients
    are plain autograd (BackendSpec.second_order) carries it through; the fused passes have no forward derivative,
    and their outputs came back with no tangent at all, the caller's jvp silently 0. Refused on those, by name,
    before any work."""
    if torch.compiler.is_compiling() or (backend != AUTO and BACKENDS[backend].second_order):
        return
    dual = next((name for name, x in named.items()
                 if isinstance(x, torch.Tensor) and forward_ad.unpack_dual(x).tangent is not None), None)
    if dual is not None:
        exact = " or ".join(repr(name) for name, spec in BACKENDS.items() if spec.second_order)
        raise ValueError(f"{dual} carries a forward-mode AD tangent (torch.autograd.forward_ad), which "
                         f"backend={backend!r} would drop silently (its fused passes have no forward derivative); "
                         f"use backend={exact}, or pass the primal (forward_ad.unpack_dual(x).primal)")


# ---- torch.use_deterministic_algorithms(True, warn_only=True) ----------------------------------------------------

def deterministic_refusal_asked(backend: str) -> bool:
    """Whether a backend that is not bitwise repeatable must be refused now: under
    torch.use_deterministic_algorithms(True), unless warn_only=True asks for a warning instead (as torch's own
    non-deterministic operators then warn); that warning is given here."""
    if not torch.are_deterministic_algorithms_enabled():
        return False
    if not torch.is_deterministic_algorithms_warn_only_enabled():
        return True
    if backend != AUTO and not BACKENDS[backend].deterministic:
        warn_at_caller(f"backend={backend!r} is not bitwise repeatable run to run (deterministic=False in its registry "
                       f"entry); torch.use_deterministic_algorithms(True, warn_only=True) asks for this warning rather "
                       f"than an error", UserWarning)
    return False
