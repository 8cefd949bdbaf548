"""The process's soft resource limits (`ulimit`), read once each where a command checks them before any work."""

from __future__ import annotations

from typing import Optional


def soft_limit(name: str) -> Optional[int]:
    """The soft limit `name` (e.g. "RLIMIT_AS", "RLIMIT_FSIZE") in bytes, or None when there is none (unlimited, or
    a platform without such a limit)."""
    try:
        import resource

        soft, _ = resource.getrlimit(getattr(resource, name))
    except (ImportError, AttributeError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY or soft < 0 else soft
