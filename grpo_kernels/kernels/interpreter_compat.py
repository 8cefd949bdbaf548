"""Loops over a runtime bound under the Triton interpreter of triton 3.6 with numpy >= 2.4.

Every kernel here sweeps the vocabulary (or H, or the tokens) with `for v0 in range(0, V, BLOCK_V)`. The
interpreter holds each scalar kernel argument as a one-element 1-d numpy array and hands `range` the int it
needs through the `__index__` it installs on `tl.tensor`: `int(array)`, which numpy 2.4 refuses for an array
with ndim > 0 ("only 0-dimensional arrays can be converted to Python scalars"; triton-lang/triton#9171, fixed
in later tritons by squeezing the array first). No spelling of the kernels avoids it: a Python loop over a
runtime bound must turn the bound into an int, and a `while` loop (whose test goes through `__bool__`, which
works) would compile to a loop that the GPU pipeliner does not software-pipeline. So each kernel module imports
this one, which, only when interpreting and only where the probe below fails, makes that `__index__` read the
array's single element, as the fixed tritons do. GPU compilation is untouched.

The interpreter also runs one launch at a time only: a launch swaps triton.language's functions for interpreted
ones for its duration and drives one process-wide builder through the grid, so two threads launching at once (a
loss called from two Python threads) undid each other's swap and failed inside the kernel ("Did you forget to add
@triton.jit ?"). Interpreted launches are serialised by a lock (serialise_launches); compiled ones are untouched.
"""

from __future__ import annotations

import functools
import operator
import threading

from .interpreter_switch import interpreting

_FIXED = "_grpo_kernels_reads_one_element"


def _index_fails(interpreter, tl) -> bool:
    """Does the interpreter's `__index__` refuse a scalar argument as the interpreter stores it?"""
    import numpy as np

    scope = interpreter._LangPatchScope()
    interpreter._patch_lang_tensor(tl.tensor, scope)
    try:
        operator.index(tl.tensor(interpreter.TensorHandle(np.array([1], dtype=np.int32), tl.int32), tl.int32))
        return False
    except TypeError:
        return True
    finally:
        scope.restore()


def fix_scalar_index() -> bool:
    """Install the fix if this triton's interpreter needs it; returns whether it is installed."""
    if not interpreting():
        return False
    import triton.language as tl
    from triton.runtime import interpreter

    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if patch_tensor is None or getattr(patch_tensor, _FIXED, False):
        return patch_tensor is not None
    if not _index_fails(interpreter, tl):
        return False

    def patch_lang_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    setattr(patch_lang_tensor, _FIXED, True)
    interpreter._patch_lang_tensor = patch_lang_tensor
    return True


_SERIALISED = "_grpo_kernels_serialised"
_LAUNCH_LOCK = threading.RLock()


def serialise_launches() -> bool:
    """Hold one lock around each interpreted launch (GridExecutor.__call__); returns whether it is installed."""
    if not interpreting():
        return False
    from triton.runtime import interpreter

    executor = getattr(interpreter, "GridExecutor", None)
    if executor is None:
        return False
    launch = executor.__call__
    if getattr(launch, _SERIALISED, False):
        return True

    @functools.wraps(launch)
    def serialised(self, *args, **kwargs):
        with _LAUNCH_LOCK:
            return launch(self, *args, **kwargs)

    setattr(serialised, _SERIALISED, True)
    executor.__call__ = serialised
    return True


fix_scalar_index()
serialise_launches()
