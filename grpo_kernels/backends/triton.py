"""The Triton backend: the fused streaming kernels of grpo_kernels/kernels/ (kernels/launch.py picks the GPU
configuration, or the interpreter for CPU tensors). Importing this module builds no kernel and imports no triton:
the interpreter must be chosen first, on the first launch."""

from __future__ import annotations

from ..kernels import launch

# Capabilities for the backend registry: a row's log-prob and entropy are bitwise the same whatever else is in the
# batch (the forward's vocabulary splits depend on V only; kernels/linear_forward.py), and the backward is bitwise
# repeatable run to run (each output row has one writer; kernels/linear_backward.py).
BATCH_INVARIANT = True
DETERMINISTIC = True


def backend(workspace_bytes: int = 0):
    """The Protocol's functions (and the logits-input ones) are kernels/launch.py's."""
    return launch
