"""TorchScript (torch.jit.script, torch.jit.trace) and torch.fx.symbolic_trace around the library's entry points:
refused by name, up front.

The entry points validate their inputs in Python (value checks read tensors as bools and ints), take keyword-only
options and run custom ops and Triton kernels: torch.jit.script failed inside its own frontend ("Compiled functions
can't take variable number of arguments ...", "Expected a single top-level function") and torch.jit.trace failed
deep inside the checks (AssertionError: Expected bool, got Tensor); torch.fx.symbolic_trace of the module failed in
the checks too, blaming an input the caller had passed as a tensor ("ref_per_token_logps must be a torch.Tensor,
got Proxy"). torch.compile and torch.export are the ways to capture a graph of the loss."""

from __future__ import annotations

import functools
from typing import Callable, Iterable, NoReturn, TypeVar

import torch
import torch.fx

_Function = TypeVar("_Function", bound=Callable)

ALTERNATIVE = "call it eagerly, or capture it with torch.compile (or torch.export)"


def refuse_scripting(name: str) -> NoReturn:
    """What torch.jit.script(entry) meets first (it calls __prepare_scriptable__ before compiling)."""
    raise TypeError(f"{name} cannot be compiled by torch.jit.script (TorchScript): it validates its inputs in Python "
                    f"and runs custom ops and Triton kernels; {ALTERNATIVE}")


def refuse_symbolic_trace(name: str, values: Iterable[object]) -> None:
    """RuntimeError naming `name` when one of `values` (the call's arguments) is a torch.fx symbolic trace's Proxy:
    the checks would read it as a wrong input."""
    if any(isinstance(value, torch.fx.Proxy) for value in values):
        raise RuntimeError(f"{name} cannot be traced by torch.fx.symbolic_trace: its input checks read values a "
                           f"symbolic trace does not have, and its kernels are not traceable; {ALTERNATIVE} (or leave "
                           f"it out of the trace: torch.fx.wrap, or a leaf module of the tracer)")


def outside_torchscript(function: _Function) -> _Function:
    """`function` refusing to run under torch.jit.trace or torch.fx.symbolic_trace, and to be scripted, with one line
    naming it."""
    @functools.wraps(function)
    def call(*args, **kwargs):
        refuse_symbolic_trace(function.__name__.removesuffix('_named'), (*args, *kwargs.values()))
        if torch.jit.is_tracing():
            # the module's forward runs the *_named entries: named as the public function they serve
            raise RuntimeError(f"{function.__name__.removesuffix('_named')} cannot run under torch.jit.trace (TorchScript): its input checks "
                               f"read values a trace would freeze, and its kernels are not traceable; {ALTERNATIVE}")
        return function(*args, **kwargs)

    call.__prepare_scriptable__ = lambda: refuse_scripting(function.__name__)  # type: ignore[attr-defined]
    return call  # type: ignore[return-value]
