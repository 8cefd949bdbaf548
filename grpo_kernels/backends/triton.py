"""The Triton backend: the fused streaming kernels of grpo_kernels/kernels/ (kernels/launch.py picks the GPU
configuration, or the interpreter for CPU tensors). Importing this module builds no kernel and imports no triton:
the interpreter must be chosen first, on the first launch."""

from __future__ import annotations

from ..kernels import launch


def backend(workspace_bytes: int = 0):
    """The Protocol's functions (and the logits-input ones) are kernels/launch.py's."""
    return launch
