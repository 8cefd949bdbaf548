"""The run directory: a directory this process can write, held by one run at a time.

A second `grpo-engine train` on a directory a run is using would interleave its checkpoints and metrics with
the first one's; it is refused at once, naming the process that holds the directory. The hold is an advisory
`flock` on a small file in the directory, which the operating system drops when its process ends however it
ends (kill -9 included): a killed run leaves no lock behind, only the file naming it, which the next run takes
over with a note.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

_log = logging.getLogger(__name__)  # grpo_engine/messages.py: how the CLI shows it

try:
    import fcntl
except ImportError:  # Windows: no flock; runs there are not protected against a second run
    fcntl = None

from .bounded_read import special_file_kind
from .path_limits import check_path_length
from .run_files import CHECKPOINT_NAME, MANIFEST, has_progress, remove_own_start
from .umask import umask_problem

LOCK_FILE = ".grpo-engine.lock"


class RunDirectoryError(RuntimeError):
    """The run directory cannot be used: not a writable directory, or held by another run."""


class RunDirectoryMoved(RunDirectoryError):
    """The run directory's path no longer leads to the directory the run holds."""


OUTPUT_KEY = "run.output_dir / --output-dir"
# A path as long as the deepest the engine writes in a run directory (a checkpoint's files while it is saved, with
# room to spare for sharded state): a run directory whose own path fit the filesystem's PATH_MAX but left less room
# than this failed at its first checkpoint, after the steps it was to save.
RUN_DIRECTORY_DEEPEST = Path("checkpoints", ".tmp-checkpoint-000000", "sharded", "x" * 100)


def resolved(path: str | Path, key: str = OUTPUT_KEY) -> Path:
    """`path` with its links followed; a loop of links (RuntimeError before Python 3.13, OSError since) is one line
    naming `key`, not Python's "Symlink loop" naming no setting."""
    try:
        return Path(path).expanduser().resolve()
    except (RuntimeError, OSError) as exc:
        raise RunDirectoryError(f"{key} {str(path)!r} cannot be resolved: {exc} (a symbolic link that leads back to "
                                f"itself?); fix the link or choose another directory") from None


def check_output_dir(path: str | Path, key: str = OUTPUT_KEY) -> None:
    """A clear error, before any work, when `path` cannot hold a run: a file, under a file, not writable, behind a
    loop of links, or inside another run's checkpoints/ or base_model/."""
    check_path_length(path, key, room=len(str(RUN_DIRECTORY_DEEPEST)) + 1, room_for="the run's checkpoint files")
    resolved(path, key)
    problem = umask_problem(key)
    if problem:
        raise RunDirectoryError(problem)
    check_writable_dir(path, key)
    _check_lock_file_opens(Path(path) / LOCK_FILE)
    checkpoints = Path(path) / "checkpoints"
    if checkpoints.is_dir():  # a link to another disk, perhaps read-only: found at the first save, after its steps
        check_writable_dir(checkpoints, f"the checkpoints/ of {key}")
    check_not_inside_a_run(path, key)


def check_writable_dir(path: str | Path, key: str) -> None:
    """A clear error when `path` cannot be written into: a file, under a file, not writable, or a path too long."""
    check_path_length(path, key)
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirectoryError(f"{key} {str(path)!r} is a file, not a directory")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise RunDirectoryError(f"{key} {str(path)!r} lies under {str(existing)!r}, which is a file")
    try:  # what the filesystem says (a read-only mount, permissions), not a guess from mode bits
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        where = "" if existing == path else f" (its nearest existing parent {str(existing)!r})"
        raise RunDirectoryError(f"{key} {str(path)!r} is not writable{where}: {exc.strerror or exc}") from None


# The entries the engine writes directly in a run directory, by kind. Each must be absent or of its kind, and not a
# link: the engine appends to its logs and replaces the others, so a directory or a FIFO there failed (or hung) at
# the first write, after the model had loaded, and a link to a file made it write into whatever the link names.
# A directory may be a link to a directory (checkpoints/ kept on another disk).
RUN_DIRECTORY_FILES = ("config.yaml", "metrics.jsonl", "samples.jsonl", "curves.png", ".grpo-engine-files.json",
                       LOCK_FILE)
RUN_DIRECTORY_DIRS = ("checkpoints", "base_model")


def check_run_entries(run_dir: str | Path) -> None:
    """One line, before any work, naming an entry of the engine's names that is of another kind or a link."""
    run_dir = Path(run_dir)
    for names, kind, is_kind in ((RUN_DIRECTORY_FILES, "a regular file", Path.is_file),
                                 (RUN_DIRECTORY_DIRS, "a directory", Path.is_dir)):
        for name in names:
            path = run_dir / name
            if path.is_symlink() and is_kind is Path.is_file:
                raise RunDirectoryError(f"{path} is a link (to {os.readlink(path)}): the engine writes its {name} "
                                        f"there itself; remove the link, or choose another --output-dir")
            if path.is_symlink() and not path.exists():
                raise RunDirectoryError(f"{path} is a link to {os.readlink(path)}, which does not exist: the engine "
                                        f"writes its {name} there; restore its target or remove the link, or choose "
                                        f"another --output-dir")
            if path.exists() and not is_kind(path):
                raise RunDirectoryError(f"{path} is not {kind} (the engine writes its {name} there); move it, or "
                                        f"choose another --output-dir")
    check_checkpoint_entries(run_dir)


def check_checkpoint_entries(run_dir: str | Path) -> None:
    """One line naming an entry of checkpoints/ of a checkpoint's name (checkpoint-NNNNNN, or its .tmp- / .old-
    forms during a save) that is not a directory or a link to one: a file or a dangling link there was passed over
    in silence on resume ("no complete checkpoint") and stopped the save of that step after the step, and a re-save
    moved the user's file aside and deleted it."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return
    for path in root.iterdir():
        if CHECKPOINT_NAME.fullmatch(path.name.removeprefix(".tmp-").removeprefix(".old-")) is None:
            continue
        if path.is_symlink() and not path.exists():
            what = f"a link to {os.readlink(path)}, which does not exist"
        elif not path.is_dir():
            what = "a link to a file" if path.is_symlink() else "not a directory"
        else:
            continue
        raise RunDirectoryError(f"{path} is {what}, where the engine keeps a checkpoint (a directory) of that name; "
                                f"move or remove it (the engine leaves it alone), or choose another --output-dir")


def _is_run_directory(path: Path) -> bool:
    """A directory the engine has run in: its lock file (which stays) or its manifest is there."""
    return (path / LOCK_FILE).is_file() or (path / MANIFEST).is_file()


def check_not_inside_a_run(path: str | Path, key: str) -> None:
    """One line when `path` is, or lies inside, a directory the engine keeps in another run's directory
    (checkpoints/, base_model/): a run written there was accepted, and it put its own checkpoints/, base_model/ and
    logs among that run's checkpoints and saved model."""
    path = resolved(path, key)
    for inner in (path, *path.parents):
        run_dir = inner.parent
        if inner.name in RUN_DIRECTORY_DIRS and run_dir != inner and _is_run_directory(run_dir):
            where = "is" if inner == path else f"lies inside {str(inner)!r},"
            raise RunDirectoryError(f"{key} {str(path)!r} {where} the {inner.name}/ of the run directory "
                                    f"{str(run_dir)!r}, which that run writes itself: choose a directory outside it")


def check_output_file(path: str | Path, key: str = "--output", may_replace: tuple[str, ...] = ()) -> None:
    """A file to write: not a directory, in a directory that can be written, its name one the filesystem takes,
    and none of a run directory's own files (`may_replace`: the names of them this command writes itself)."""
    check_path_length(path, key)
    path = Path(path)
    if path.is_dir():
        raise RunDirectoryError(f"{key} {str(path)!r} is a directory; name the file to write")
    kind = special_file_kind(path)
    if kind is not None:  # written whole and renamed over, it would be replaced: /dev/null itself, as root
        raise RunDirectoryError(f"{key} {str(path)!r} is {kind}, not a regular file; name a regular file to write")
    check_writable_dir(Path(os.path.realpath(path)).parent if path.is_symlink() else path.parent,
                       key=f"the directory of {key}")
    check_not_a_run_file(path, key, may_replace)


def check_not_a_run_file(path: str | Path, key: str, may_replace: tuple[str, ...] = ()) -> None:
    """One line when `path` is a file a run keeps in its directory (its metrics.jsonl, config.yaml, lock, ...) or
    lies in a run's checkpoints/ or base_model/: `eval --output RUN/metrics.jsonl` replaced a run's log, the run
    still training or not, with the evaluation's JSON."""
    path = resolved(path, key)
    if path.name in RUN_DIRECTORY_FILES and path.name not in may_replace and _is_run_directory(path.parent):
        raise RunDirectoryError(f"{key} {str(path)!r} is the {path.name} of the run directory {str(path.parent)!r}, "
                                f"which that run writes itself: name a file outside the run's own")
    check_not_inside_a_run(path, key)


def _check_lock_file_opens(lock: Path) -> None:
    """A run directory's lock file this user cannot open for writing (another user's, or made immutable) is one line
    naming the directory and its owner, before any work: it was a raw PermissionError after the imports."""
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return  # made when the run takes the directory
    except PermissionError as exc:
        raise RunDirectoryError(_lock_file_refusal(lock, exc)) from None
    except OSError:
        return  # a special file: check_run_entries names it
    os.close(fd)


def _lock_file_refusal(lock: Path, exc: OSError) -> str:
    import errno

    try:
        uid = lock.stat().st_uid
    except OSError:
        uid = None
    owner = "another user" if uid is None else _user(uid)
    why = (f"it is marked immutable or append-only (lsattr shows it; chattr -i {lock} removes the mark)"
           if exc.errno == errno.EPERM else
           f"it belongs to {owner} and this user ({_user(os.getuid())}) may not write it; run as its owner")
    return (f"the run directory {lock.parent} is held by its lock file {lock.name}, which this process cannot open "
            f"({exc.strerror}): {why}, or choose another --output-dir")


def _user(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"user id {uid}"


def _holder(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 4096).decode(errors="replace").strip()


def _write_holder(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"process {os.getpid()} on {socket.gethostname()}, since "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
    os.fsync(fd)


def _identity(path: Path) -> Optional[tuple[int, int]]:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


class RunLock:
    """The exclusive hold of one run directory by this process."""

    def __init__(self, run_dir: Path, fd: int, created: Optional[Path]) -> None:
        self.run_dir, self._fd, self._created = run_dir, fd, created
        self._directory = _identity(run_dir)  # the directory itself, told apart from its lock file

    @classmethod
    def acquire(cls, run_dir: str | Path) -> "RunLock":
        run_dir = Path(run_dir)
        created = None  # the outermost directory made here: removed again if the run writes nothing into it
        for directory in (run_dir, *run_dir.parents):
            if directory.exists():
                break
            created = directory
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError as exc:  # made unopenable between the check and here
            raise RunDirectoryError(_lock_file_refusal(run_dir / LOCK_FILE, exc)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd) or "a process that has not yet written its id"
            os.close(fd)
            raise RunDirectoryError(f"{run_dir} is in use by another run ({holder}); wait for it to finish, stop it, "
                                    f"or choose another --output-dir") from None
        except OSError as exc:  # a filesystem without locks (some network mounts): say so, do not pretend
            os.close(fd)
            raise RunDirectoryError(f"cannot lock {run_dir / LOCK_FILE} ({exc.strerror or exc}): put the run "
                                    f"directory on a local filesystem") from None
        stale = _holder(fd)
        if stale:  # a released lock is emptied: text left behind is a run that ended without releasing it
            _log.warning(f"note: {run_dir} was held by a run that ended without releasing it ({stale}); taking it "
                        "over")
        _write_holder(fd)
        return cls(run_dir, fd, created)

    def in_place(self) -> bool:
        """Whether the run directory's path still leads to the directory this run holds (its lock file, this one; a
        lock file deleted from that very directory is made and held again)."""
        if self._fd is None:
            return True
        held = os.fstat(self._fd)
        try:
            there = os.stat(self.run_dir / LOCK_FILE)
        except FileNotFoundError:
            return self._retake()
        except OSError:
            return False
        return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)

    def _retake(self) -> bool:
        """The lock file alone deleted (a tidy-up, `rm` of a lock thought stale) in the directory this run holds: a
        new one is made and locked, so a second run is still refused. Before, the run stopped as if its directory
        had been deleted, losing its steps since the last checkpoint."""
        if _identity(self.run_dir) != self._directory:
            return False
        try:  # O_EXCL: a lock file another run made meanwhile is that run's, never taken over
            fd = os.open(self.run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        _write_holder(fd)
        os.close(self._fd)
        self._fd = fd
        _log.warning(f"note: {self.run_dir / LOCK_FILE} was deleted while the run trained; made again, the run "
                     f"holds its directory as before")
        return True

    def moved(self, step: int) -> "RunDirectoryMoved":
        return RunDirectoryMoved(f"the run directory {self.run_dir} was deleted, moved or replaced while the run "
                                 f"trained: stopped after step {step}, before writing anything there; its steps since "
                                 f"the last checkpoint saved in it are lost. Put it back and continue with --resume, "
                                 f"or start again")

    def release(self) -> None:
        """Empty the file (the lock file itself stays: deleting it would let two later runs lock two files)."""
        if self._fd is None:
            return
        in_place = self.in_place()  # a directory deleted, moved or replaced meanwhile is not this run's to tidy
        os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing drops the flock
        self._fd = None
        if in_place and self._created is not None and [p.name for p in self.run_dir.iterdir()] == [LOCK_FILE]:
            # a run that stopped before writing anything (bad data, a refused option) leaves no directory behind
            (self.run_dir / LOCK_FILE).unlink()
            for directory in (self.run_dir, *self.run_dir.parents):
                directory.rmdir()
                if directory == self._created:
                    break


def _is_main_process() -> bool:
    # Before accelerate starts: the launchers (torchrun, accelerate launch) say the rank in the environment.
    return int(os.environ.get("RANK", "0")) == 0


@contextmanager
def hold_run_directory(run_dir: str | Path) -> Iterator[Optional[RunLock]]:
    """The run directory, checked and held for the duration (by the main process; without flock, checked only)."""
    check_output_dir(run_dir)
    check_run_entries(run_dir)  # the CLI checked them before its imports; a program calling train() gets them here
    lock = RunLock.acquire(run_dir) if fcntl is not None and _is_main_process() else None
    progress_before = lock is not None and has_progress(lock.run_dir)
    present_before = {p.name for p in lock.run_dir.iterdir()} if lock is not None else set()
    try:
        yield lock
    except BaseException:
        # A start that failed before its first step, where no run had got anywhere: what it wrote would only stand
        # in the way of the corrected command (a config.yaml of other options, the demo's base_model/).
        if lock is not None and not progress_before and lock.in_place() and not has_progress(lock.run_dir):
            remove_own_start(lock.run_dir, present_before)
        raise
    finally:
        if lock is not None:
            lock.release()
