"""The address space a command that loads torch needs, checked before it loads anything.

An address-space limit (ulimit -v, RLIMIT_AS; set by some batch schedulers and shared login nodes) stops torch's
import long before the machine's memory runs out, and each way it stops was unclear: a MemoryError traceback of
some fifty lines through importlib, an ImportError "libtorch_cpu.so: failed to map segment from shared object", or
OpenBLAS's four lines about threads followed by "interrupted". Below MIN_ADDRESS_SPACE no such command can run:
it is refused in one line naming the limit. Above it a model can still be too large for the limit; a MemoryError
or a library that could not be mapped then says the same (out_of_memory_message).
"""

from __future__ import annotations

from typing import Optional

from .resource_limits import soft_limit

# torch, transformers and their libraries map about 1 GiB of address space before any model loads (the built-in
# demo's whole run fits in 1.2 GiB; 0.6 GiB stops torch's import).
MIN_ADDRESS_SPACE = 2**30
# The commands that import torch.
TORCH_COMMANDS = ("train", "eval", "bench", "serve")
# How a shared library that did not fit in the address space is reported by the dynamic loader (an ImportError).
MAPPING_FAILED = ("failed to map segment", "cannot allocate memory", "cannot map zero-fill pages")


class AddressSpaceTooSmall(RuntimeError):
    """The process's address-space limit is below what the command needs."""


def address_space_limit() -> Optional[int]:
    """The soft RLIMIT_AS in bytes, or None when there is none (or the platform has no such limit)."""
    return soft_limit("RLIMIT_AS")


def _limit_text(limit: int) -> str:
    return f"{limit / 2**30:.2f} GiB of address space (ulimit -v / RLIMIT_AS)"


def check_address_space(command: str) -> None:
    """AddressSpaceTooSmall, in one line, when `command` imports torch and the limit is below MIN_ADDRESS_SPACE."""
    limit = address_space_limit()
    if command in TORCH_COMMANDS and limit is not None and limit < MIN_ADDRESS_SPACE:
        raise AddressSpaceTooSmall(f"the process may use at most {_limit_text(limit)}, and torch alone needs about "
                                   f"{MIN_ADDRESS_SPACE / 2**30:.0f} GiB of it: raise the limit (ulimit -v unlimited) "
                                   f"and run again")


def is_out_of_memory(exc: BaseException) -> bool:
    """A MemoryError, or a shared library the loader could not map (an ImportError saying so)."""
    return isinstance(exc, MemoryError) or (
        isinstance(exc, ImportError) and any(text in str(exc).lower() for text in MAPPING_FAILED))


def out_of_memory_message(command: Optional[str], prog: str = "grpo-engine") -> str:
    """One line for an out-of-memory failure of `prog` (and its subcommand): the address-space limit when one is set,
    else the machine's memory."""
    limit = address_space_limit()
    cause = (f"the process may use at most {_limit_text(limit)}; raise the limit (ulimit -v unlimited) and run again"
             if limit is not None else "the machine's memory ran out; free some, or use a smaller model or batch")
    return f"{prog}{f' {command}' if command else ''}: out of memory: {cause}"
