"""How long a path and each name in it may be, checked before any work, and long paths shown short in messages.

A name over the filesystem's limit (NAME_MAX, 255 bytes on most: bytes, so 128 two-byte letters are already too
many) or a path over PATH_MAX failed deep inside with "[Errno 36] File name too long" followed by the whole path,
thousands of characters on one line, and only once the work it was to hold was done: `eval --output` evaluated,
then could not write. Checked where a command reads its paths, the failure is one short line naming the option.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

# POSIX's usual values, for a directory whose own limits cannot be asked (it does not exist yet, or the platform
# has no pathconf).
DEFAULT_NAME_MAX = 255
DEFAULT_PATH_MAX = 4096


class PathTooLong(ValueError):
    """A path with a name, or a whole, longer than its filesystem takes; `reason` says which, without the path."""

    def __init__(self, key: str, path: str | Path, reason: str) -> None:
        super().__init__(f"{key} {shown(path)}: {reason}")
        self.reason = reason


def shown(path: str | Path, width: int = 80) -> str:
    """`path` quoted, its middle elided past `width` characters: a message stays one readable line."""
    text = str(path)
    if len(text) <= width:
        return repr(text)
    keep = (width - 1) // 2
    return repr(f"{text[:keep]}…{text[-keep:]}")


def _nearest_existing(path: Path) -> Optional[Path]:
    existing = path
    while existing != existing.parent:
        try:
            if existing.is_dir():
                return existing
        except OSError:  # a name too long to even ask about: look further up
            pass
        existing = existing.parent
    return existing if existing.is_dir() else None


def limits_at(path: str | Path) -> tuple[int, int]:
    """(NAME_MAX, PATH_MAX) in bytes of the filesystem `path` is (or would be) on."""
    directory = _nearest_existing(Path(os.path.abspath(path)))
    name_max, path_max = DEFAULT_NAME_MAX, DEFAULT_PATH_MAX
    if directory is not None and hasattr(os, "pathconf"):
        try:
            name_max = os.pathconf(directory, "PC_NAME_MAX")
            path_max = os.pathconf(directory, "PC_PATH_MAX")
        except (OSError, ValueError):
            pass
    return (name_max if name_max and name_max > 0 else DEFAULT_NAME_MAX,
            path_max if path_max and path_max > 0 else DEFAULT_PATH_MAX)


def check_path_length(path: str | Path, key: str, room: int = 0, room_for: str = "") -> None:
    """PathTooLong, in one line naming `key`, when a name in `path` or the whole of it is longer than the filesystem
    takes; with `room`, when the whole leaves fewer than `room` bytes for what is written below it (`room_for`)."""
    name_max, path_max = limits_at(path)
    for name in Path(path).parts:
        size = len(os.fsencode(name))
        if size > name_max:
            raise PathTooLong(key, path, f"expected a path whose every name is at most {name_max} bytes on this "
                                         f"filesystem; the name {shown(name, 40)} is {size} bytes long: shorten it")
    size = len(os.fsencode(os.path.abspath(path)))
    if size + room >= path_max:
        below = f", leaving less than the {room} bytes {room_for} need below it" if room else ""
        raise PathTooLong(key, path, f"expected a path of at most {path_max - 1} bytes on this filesystem; this one "
                                     f"is {size} bytes long{below}: use a shorter one")


def name_within(name: str, name_max: int) -> str:
    """`name`, shortened from its end when longer than `name_max` bytes, never splitting a character."""
    while name and len(os.fsencode(name)) > name_max:
        name = name[:-1]
    return name
