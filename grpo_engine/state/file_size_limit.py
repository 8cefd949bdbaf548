"""The largest file this process may write (ulimit -f, RLIMIT_FSIZE), checked before the work whose files it
would cut short.

A file-size limit (set by some batch schedulers and shared machines) failed a run only when it wrote a file past it:
the built-in model's save with a 27-line safetensors traceback ("File too large (os error 27)"), a checkpoint after
the steps it was to save, each naming no limit. A run is refused before its first step when its checkpoint's largest
file (the weights, or AdamW's two moments of the trained ones) would not fit; any other write past the limit (EFBIG)
is one line naming it (cli.py).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..resource_limits import soft_limit

# What a file holds besides the tensors (names, shapes, the pickle's structure), and a margin for it.
FILE_OVERHEAD = 2**16


class FileSizeLimitTooSmall(RuntimeError):
    """The process's file-size limit is below the size of a file the run will write."""


def file_size_limit() -> Optional[int]:
    """The soft RLIMIT_FSIZE in bytes, or None when there is none."""
    return soft_limit("RLIMIT_FSIZE")


def size_text(size: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def limit_text(limit: int) -> str:
    return f"files of at most {size_text(limit)} (ulimit -f / RLIMIT_FSIZE)"


def largest_checkpoint_file(model: torch.nn.Module) -> int:
    """An upper estimate of the largest file a checkpoint of `model` holds: its weights (model.safetensors), or
    AdamW's two moments of its trained weights (optimizer.pt), whichever is larger."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    trained = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return int(max(weights, 2 * trained) * 1.01) + FILE_OVERHEAD


def check_file_size_limit(largest: int, what: str) -> None:
    """FileSizeLimitTooSmall, in one line, when the limit is below `largest` bytes (`what`: the file it is)."""
    limit = file_size_limit()
    if limit is not None and limit < largest:
        raise FileSizeLimitTooSmall(f"this process may write {limit_text(limit)}, and {what} take about "
                                    f"{size_text(largest)}: raise the limit (ulimit -f unlimited) and run again")
