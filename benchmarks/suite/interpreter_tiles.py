"""The Triton interpreter's tiles for the suite's CPU runs.

The library's own interpreter table (grpo_kernels/kernels/configs.py: INTERPRETER_CONFIGS) is small on purpose:
the tests' small shapes then cross several tiles and splits. The interpreter's time is per program, so the suite,
which measures paths rather than tile boundaries, runs each kernel over tiles of 64 rows x 256 vocabulary
columns x 64 of H instead: about 6x faster on the smoke shapes (each Triton case 0.5 s instead of 3 s), the same
results (every kernel is tested against float64 at both tables). On a GPU the interpreter is off and the GPU table
is used as always.
"""

from __future__ import annotations

from grpo_kernels.kernels.configs import INTERPRETER_CONFIGS, KernelConfig

_ROWS, _COLUMNS, _DEPTH = 64, 256, 64
SUITE_INTERPRETER_CONFIGS: dict[str, KernelConfig] = {
    "forward": KernelConfig(_ROWS, _COLUMNS, _DEPTH, split_tiles=2),
    "grad_hidden": KernelConfig(_ROWS, _COLUMNS, _DEPTH),
    "grad_weight": KernelConfig(_ROWS, _COLUMNS, _DEPTH),
    "grad_tiles": KernelConfig(_ROWS, _COLUMNS, _DEPTH),
    "merge": KernelConfig(_ROWS, 1),
    "logits": KernelConfig(_ROWS, _COLUMNS),
    "persistent": KernelConfig(_ROWS, _COLUMNS, _DEPTH, split_tiles=2),
    # the dz kernel's tile is the forward's vocabulary tile (launch.chunk_grad_ asserts it)
    "chunk_grad": KernelConfig(_ROWS, _COLUMNS),
    "persistent_dz": KernelConfig(_ROWS, _COLUMNS, _DEPTH),
}


def use_suite_tiles() -> None:
    """Make the suite's table the interpreter's for this process (the suite runs in a process of its own)."""
    assert set(SUITE_INTERPRETER_CONFIGS) == set(INTERPRETER_CONFIGS), "a kernel without a suite tile"
    INTERPRETER_CONFIGS.update(SUITE_INTERPRETER_CONFIGS)
