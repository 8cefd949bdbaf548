"""The Triton backend with the opt-in one-kernel backward (kernels/tile_backward.py): the same forward kernels
as backends/triton.py, and a trained head's dH and dW from one recompute of each logits tile, added with float32
atomics. One GEMM-equivalent fewer than the default backward, but not bitwise repeatable run to run, so `auto`
never picks it and it is refused under torch.use_deterministic_algorithms(True) (its registry entry:
deterministic=False)."""

from __future__ import annotations

from ..kernels import launch


class _TileBackward:
    """kernels/launch.py's functions, with the backward of tile_backward.py."""

    linear_backward = staticmethod(launch.linear_backward_tiles)

    def __getattr__(self, name: str):
        return getattr(launch, name)


def backend(workspace_bytes: int = 0):
    return _TileBackward()
