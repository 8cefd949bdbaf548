"""Files a command writes whole or not at all: the previous file stays as it was until the new one is complete.

Written in place, a file is half-written whenever its writer stops midway (an exception, Ctrl-C, SIGTERM, a full
disk): a user's metrics, results or README would then be cut off and the earlier version gone. Here the new bytes
go to a temporary file beside the target, are flushed to disk (fsync), and only then renamed over the target, which
a POSIX rename does in one step; the directory is synced so the rename survives a crash. Whatever stops the write
before the rename removes the temporary file and leaves the target untouched.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .bounded_read import special_file_kind
from .path_limits import limits_at, name_within


class FileWriteError(OSError):
    """A file that could not be written: one line naming it, saying it was left as it was (errno kept)."""

    def __init__(self, path: Path, cause: OSError) -> None:
        what = "no space left on device" if cause.errno in (errno.ENOSPC, errno.EDQUOT) else (cause.strerror or str(cause))
        super().__init__(cause.errno, f"cannot write {path}: {what}; {path} was left as it was")
        self.path = path

    def __str__(self) -> str:
        return self.strerror


def temporary_beside(path: Path, keep_suffix: bool = True) -> Path:
    """A hidden name next to `path`, in its directory (a rename across filesystems is no rename), ending in the
    same suffix (matplotlib and others pick the format from it). Never longer than the filesystem takes a name
    when `path`'s own name fits: a target named near that limit (an `eval --output` of 240 characters) could not be
    written at all when its temporary name, some 20 bytes longer, was over it; there the name is cut short and a
    digest of the whole name keeps two such targets apart. `keep_suffix` False: a name no reader that picks files
    by their suffix takes (a vLLM server globbing *.safetensors in the directory it reloads from)."""
    tail = f".partial-{os.getpid()}"
    name = f".{path.name}{tail}{path.suffix * keep_suffix}"
    name_max = limits_at(path.parent)[0]
    if len(os.fsencode(name)) <= name_max:
        return path.with_name(name)
    suffix = path.suffix if keep_suffix and len(os.fsencode(path.suffix)) <= 16 else ""
    digest = hashlib.sha256(os.fsencode(path.name)).hexdigest()[:12]
    room = name_max - len(os.fsencode(f".~{digest}{tail}{suffix}"))
    return path.with_name(f".{name_within(path.name, room)}~{digest}{tail}{suffix}")


@contextmanager
def replacing(path: str | Path, keep_suffix: bool = True) -> Iterator[Path]:
    """The temporary path to write the new content of `path` to (a file, or a directory of files made there); when
    the block ends without an exception it is synced and renamed over `path` (a directory only onto a new name or
    an empty directory). Any exception (KeyboardInterrupt included) removes it and leaves `path` as it was; an
    OSError is raised again as a FileWriteError naming `path`."""
    path = Path(path)
    if path.is_symlink():  # a link to the user's file: that file is replaced, the link stays a link
        path = Path(os.path.realpath(path))
    kind = special_file_kind(path)
    if kind is not None:  # renamed over, /dev/null (as root) or a reader's FIFO became a regular file
        raise FileWriteError(path, OSError(errno.EINVAL, f"it is {kind}, not a regular file"))
    temporary = temporary_beside(path, keep_suffix)
    try:
        yield temporary
        for written in sorted(temporary.rglob("*")) if temporary.is_dir() else ():
            if written.is_file():
                _sync_file(written)
        _sync_file(temporary)
        os.replace(temporary, path)
    except BaseException as exc:
        _remove_quietly(temporary)
        if isinstance(exc, OSError) and not isinstance(exc, FileWriteError):
            raise FileWriteError(path, exc) from exc
        raise
    _sync_directory(path.parent)


def write_atomically(path: str | Path, content: str | bytes) -> None:
    """`path` holding exactly `content` (text as UTF-8), or, when the write fails, as it was before."""
    data = content.encode() if isinstance(content, str) else content
    with replacing(path) as temporary:
        with open(temporary, "wb") as f:
            f.write(data)


def _sync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_directory(directory: Path) -> None:
    # Makes the rename itself durable; some filesystems cannot open or sync a directory, which loses nothing written.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_quietly(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        os.unlink(path)
    except OSError:
        pass
