"""The caller's saved-tensor hooks, lifted around the differentiation the library runs inside its own passes.

A caller may compute the loss under saved-tensor hooks: `torch.autograd.graph.save_on_cpu()` (activations kept in
host memory), `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)` (its forward and its recomputation),
an activation-offloading wrapper, or any `saved_tensors_hooks`. torch.func refuses to run under them ("torch.func.
{grad, vjp, jacrev, hessian} don't yet support saved tensor hooks"), and the one-pass route differentiates the
objective per wave with torch.func inside its forward: under such hooks the default backend failed, in torch's
words, where every other route ran. The hooks are there for the tensors the caller's graph saves for its backward;
what torch.func differentiates inside a pass is transient (used and freed within the pass) and saved for no outer
backward, so the hooks are set aside for it and put back as they were. What the passes do save for the caller's
backward (the custom ops' saved tensors) is saved outside this context, under the caller's hooks.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def lifted_saved_tensor_hooks() -> Iterator[None]:
    """No saved-tensor hooks inside; the caller's stack (innermost last) restored on the way out, whatever
    happens inside. The stack is per thread, as torch keeps it."""
    autograd = torch._C._autograd
    stack = []
    while (top := autograd._top_saved_tensors_default_hooks(True)) is not None:
        stack.append(top)
        autograd._pop_saved_tensors_default_hooks()
    try:
        yield
    finally:
        for pack, unpack in reversed(stack):
            autograd._push_saved_tensors_default_hooks(pack, unpack)
