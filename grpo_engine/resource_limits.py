"""The process's soft resource limits (`ulimit`) and the CPUs it may run on, read where a command checks them before
any work."""

from __future__ import annotations

import os
from typing import Optional


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: a container's or taskset's share, not the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def limits(name: str) -> Optional[tuple[Optional[int], Optional[int]]]:
    """The (soft, hard) limit `name` (e.g. "RLIMIT_AS", "RLIMIT_CPU"), None for unlimited, or None when the platform
    has no such limit."""
    try:
        import resource

        pair = resource.getrlimit(getattr(resource, name))
    except (ImportError, AttributeError, OSError, ValueError):
        return None
    return tuple(None if value == resource.RLIM_INFINITY or value < 0 else value for value in pair)


def soft_limit(name: str) -> Optional[int]:
    """The soft limit `name` (e.g. "RLIMIT_AS", "RLIMIT_FSIZE") in bytes, or None when there is none (unlimited, or
    a platform without such a limit)."""
    pair = limits(name)
    return None if pair is None else pair[0]
