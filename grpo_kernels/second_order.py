"""What the fused backwards can and cannot be asked by autograd: no second-order gradients, and a graph kept
for another backward (retain_graph=True) must find its saved tensors unchanged.

The fused backwards (the GEMM path, the Triton kernels, the chunked torch code) compute dLoss/dhidden and
dLoss/dW from the softmax statistics in opaque passes that have no derivative of their own. A backward asked
to build a graph (`torch.autograd.grad(..., create_graph=True)`, a gradient penalty) would hand back a gradient
whose own gradient is silently missing; it is refused instead, on every fused backend, with this message.
"""

from __future__ import annotations

import torch

from .backends import BACKENDS

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
