"""The process's umask, checked before a run makes its directory: one that takes a permission from the owner makes
every file and directory the run writes unusable to the user who wrote them. A umask of 0377 let the run directory be
made read-only to its owner, whose first write into it then failed, after the seconds of imports, as a
PermissionError naming one file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

OWNER_BITS = {0o400: "read", 0o200: "write", 0o100: "search (execute)"}


def current_umask() -> int:
    """The umask, read from /proc where Linux shows it (setting it to read it, the only other way, races threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def umask_problem(key: str) -> Optional[str]:
    """What the umask takes from the owner of what the run (`key`: the directory's setting) makes, or None."""
    mask = current_umask()
    taken = [what for bit, what in OWNER_BITS.items() if mask & bit]
    if not taken:
        return None
    return (f"the umask {mask:04o} takes the owner's {' and '.join(taken)} permission from every file and directory "
            f"the run makes in {key}: set a umask that leaves the owner's bits (umask 022, or 077 to keep the run "
            f"private) and run again")
