"""A caller's Python dispatch mode around a loss call: FlopCounterMode (MFU accounting), a TorchDispatchMode of
their own (op logging, debugging), torch.autograd.graph.allow_mutation_on_saved_tensors().

The ONE_PASS route differentiates the objective with torch.func inside a custom op's implementation. Under such a
mode that implementation runs from the mode's handler, where torch.func's wrapped tensors reach plain kernels: the
default backend failed deep inside the objective ("Cannot access storage of TensorWrapper") where every other route
ran. A call under a mode takes the two-step route instead (the same values; backends/__init__.py token_level_route),
on every backend alike; torch.compile's own modes are not the caller's and are decided by `compiling`."""

from __future__ import annotations

import torch


def caller_dispatch_mode() -> bool:
    """Whether a TorchDispatchMode is active now, outside torch.compile (whose tracing modes are its own)."""
    return not torch.compiler.is_compiling() and torch._C._len_torch_dispatch_stack() > 0
