"""What a path can be at all, checked before anything looks for it (config path keys, --config, the tools' path
arguments).

The kernel's bounds on a name, NAME_MAX bytes a component and PATH_MAX bytes in all (Linux's and macOS's alike): past
them the first look failed with "OSError: File name too long", naming no key or flag. And no control character: NUL
ends a C string (no file has one in its name), and a line break, tab or escape in a path is a paste or quoting
accident (`$(cat file)`), which made a run directory whose name printed over two lines.
"""

from __future__ import annotations

import os
import unicodedata
from typing import Optional

from ..state.path_limits import limits_at


def path_form_problem(name: str) -> Optional[str]:
    """What keeps `name` (~ expanded as the shell does) from being a path, as "a path ..." the caller prefixes with
    "expected", or None. The bounds are those of the filesystem the path is (or would be) on (path_limits.limits_at:
    pathconf, else POSIX's usual 255 and 4096), applied to the path as the system call receives it."""
    control = next((char for char in name if unicodedata.category(char) == "Cc"), None)
    if control is not None:
        return f"a path without control characters ({control!r} at character {name.index(control)})"
    expanded = os.path.expanduser(name)
    name_max, path_max = limits_at(expanded)
    encoded = os.fsencode(expanded)
    if len(encoded) >= path_max:  # PATH_MAX counts the terminating NUL
        return f"a path of at most {path_max - 1} bytes (the system's bound; this one has {len(encoded):,})"
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > name_max:
        return (f"a path whose every name is at most {name_max} bytes (the system's bound; one here has "
                f"{len(longest):,})")
    return None
