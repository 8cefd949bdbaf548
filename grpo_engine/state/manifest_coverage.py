"""Which files of a checkpoint a resume reads without its manifest vouching for them.

A checkpoint's manifest (checksums.json) is written last, over every file of the save. It verifies the files it
names; a file it does not name was added after the save, or had its entry removed. Such a file was read unverified:
an optimizer.pt copied in from an older checkpoint with its entry deleted resumed silently with the wrong AdamW
state, and a copied rng-1.pt made a one-process checkpoint read as "saved by 2 data-parallel processes".
"""

from __future__ import annotations

import re
from pathlib import Path

# What a resume (or a model load from model/) reads: these files at the top, anything in these directories.
_READ_AT_TOP = re.compile(r"trainer_state\.json|config\.yaml|scheduler\.pt|optimizer(-tp\d+)?\.pt|rng-\d+\.pt")
_READ_DIRECTORIES = ("model", "sharded", "history")
# Hidden files inside them are a file manager's or an editor's (.DS_Store, .ipynb_checkpoints/), except the one
# the engine's sharded save writes.
_OWN_HIDDEN = {".metadata"}


def _read_by_the_engine(name: str) -> bool:
    parts = Path(name).parts
    if len(parts) == 1:
        return _READ_AT_TOP.fullmatch(name) is not None
    return parts[0] in _READ_DIRECTORIES and not any(
        part.startswith(".") and part not in _OWN_HIDDEN for part in parts[1:])


def unverified_files(checkpoint: Path, listed: set[str]) -> list[str]:
    """The files under `checkpoint` that the engine reads and the manifest (its entries: `listed`) does not name."""
    found = (str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file())
    return sorted(name for name in found if name not in listed and _read_by_the_engine(name))
