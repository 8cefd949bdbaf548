"""What a path can be at all, checked before anything looks for it (config path keys, --config, the tools' path
arguments).

The kernel's bounds on a name, NAME_MAX bytes a component and PATH_MAX bytes in all (Linux's and macOS's alike): past
them the first look failed with "OSError: File name too long", naming no key or flag. And no control character: NUL
ends a C string (no file has one in its name), and a line break, tab or escape in a path is a paste or quoting
accident (`$(cat file)`), which made a run directory whose name printed over two lines. And no shell variable or
command substitution left unexpanded (`$HOME/runs`, `${DATA}/train.jsonl`, `$(date)`): a config file, or a flag in
single quotes, reaches the engine without a shell expanding it, and `run.output_dir: $HOME/runs/x` made a directory
named `$HOME` in the working directory. A path of that form that exists as written is taken (a file may have a `$` in
its name). The same holds for the family's other members: a backquoted command (`` `date +%F` ``, the older spelling
of `$(...)`), and characters that a terminal shows as nothing or as a line break although they are no control
character: Unicode's format characters (a zero-width space, a byte-order mark, a soft hyphen, the
bidirectional marks and overrides that print a name backwards) and its line and paragraph separators (U+2028, U+2029):
pasted from a web page or a chat, they made a directory no one could type or see the name of. Likewise a name that
starts or ends with white space (`--output-dir "runs/a "`, a quoted YAML value with a trailing space), unless it
exists as written: the run trained into a directory whose name showed no sign of the space.
"""

from __future__ import annotations

import os
import re
import unicodedata
from typing import Optional

from ..state.path_limits import limits_at

# What a POSIX shell expands: $NAME, ${...}, $(...) and its older form `...`; the first found is named.
_SHELL_EXPANSION = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[^}]*\}?|\()|`[^`]*`")
# Unicode categories a path's character may not be: controls (Cc), invisible format characters (Cf) and the line and
# paragraph separators (Zl, Zp), none of which a person types into a path on purpose. The zero-width non-joiner and
# joiner (U+200C, U+200D) are format characters that Persian and Indic words and emoji sequences are written with.
_WRITTEN_FORMAT = {"\u200c", "\u200d"}
_UNSEEN_CATEGORIES = {"Cc": "a control character", "Cf": "an invisible format character",
                      "Zl": "a line separator", "Zp": "a paragraph separator"}


def path_form_problem(name: str) -> Optional[str]:
    """What keeps `name` (~ expanded as the shell does) from being a path, as "a path ..." the caller prefixes with
    "expected", or None. The bounds are those of the filesystem the path is (or would be) on (path_limits.limits_at:
    pathconf, else POSIX's usual 255 and 4096), applied to the path as the system call receives it."""
    control = next((char for char in name
                    if unicodedata.category(char) in _UNSEEN_CATEGORIES and char not in _WRITTEN_FORMAT), None)
    if control is not None:
        kind = _UNSEEN_CATEGORIES[unicodedata.category(control)]
        return (f"a path without control characters or invisible ones ({control!r} at character "
                f"{name.index(control)}: {kind}, U+{ord(control):04X})")
    expanded = os.path.expanduser(name)
    home = _home_problem(name, expanded)
    if home is not None:
        return home
    name_max, path_max = limits_at(expanded)
    encoded = os.fsencode(expanded)
    if len(encoded) >= path_max:  # PATH_MAX counts the terminating NUL
        return f"a path of at most {path_max - 1} bytes (the system's bound; this one has {len(encoded):,})"
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > name_max:
        return (f"a path whose every name is at most {name_max} bytes (the system's bound; one here has "
                f"{len(longest):,})")
    padded = _padded_name(name)
    if padded is not None and not _exists_as_written(name, padded + 1):
        return (f"a path whose names neither start nor end with white space (character {padded} is "
                f"{name[padded]!r}: a quoting or paste accident made a directory named with it, which `ls` shows as "
                f"if it were not there)")
    shell = _SHELL_EXPANSION.search(name)
    if shell is not None and not _exists_as_written(name, shell.end()):
        return (f"a path with no shell expansion in it ({shell.group()[:40]!r} at character {shell.start()}: the engine "
                f"expands only ~, and a config file or a quoted flag reaches it with no shell to expand the rest)")
    return None


def _padded_name(name: str) -> Optional[int]:
    """The index of a white-space character (a space, a tab, a no-break space) opening or closing one of the names
    of path `name`, or None."""
    start = 0
    for part in name.split("/"):
        if part and (part[0].isspace() or part[-1].isspace()):
            return start if part[0].isspace() else start + len(part) - 1
        start += len(part) + 1
    return None


def _home_problem(name: str, expanded: str) -> Optional[str]:
    """Why a leading `~` or `~user` of `name` names no home directory, or None. Left as written by expanduser, it
    reached pathlib's expanduser, which raised "RuntimeError: Could not determine home directory." naming nothing
    (--config, plot's RUN_DIR), or a run directory was refused as "a symbolic link that leads back to itself?"."""
    if not name.startswith("~") or expanded != name:
        return None
    first = name.split("/", 1)[0]
    if os.path.lexists(first):  # a file or directory named `~x` in the working directory: taken as written
        return None
    user = first[1:]
    whose = f"there is no user {user!r} on this system" if user else "HOME is not set and this user has none"
    return f"a path whose leading {first} names a home directory ({whose}; ~ alone is your own home)"


def _exists_as_written(name: str, end: int) -> bool:
    """Whether the path up to the end of the name holding character `end - 1` exists as written (a directory called
    `$HOME` in which a run directory is yet to be made). Within the bounds checked first, the look cannot fail."""
    cut = name.find("/", end)
    return os.path.lexists(os.path.expanduser(name if cut < 0 else name[:cut]))
