"""The Triton backend with the opt-in one-kernel backward (kernels/tile_backward.py): the same forward kernels
as backends/triton.py, and a trained head's dH and dW from one recompute of each logits tile, added with float32
atomics. One GEMM-equivalent fewer than the default backward, but not bitwise repeatable run to run, so `auto`
never picks it and it is refused under torch.use_deterministic_algorithms(True) (its registry entry:
deterministic=False)."""

from __future__ import annotations

from types import SimpleNamespace

from ..kernels import launch

# The Protocol's calls and the EPILOGUE route's, as plain attributes (isinstance against a runtime-checkable
# Protocol looks them up statically from Python 3.12 on): kernels/launch.py's, the backward swapped.
_BACKEND = SimpleNamespace(linear_forward=launch.linear_forward, linear_backward=launch.linear_backward_tiles,
                           linear_grpo_forward=launch.linear_grpo_forward)


def backend(workspace_bytes: int = 0) -> SimpleNamespace:
    return _BACKEND
