"""Whether Triton runs interpreted (TRITON_INTERPRET), read as Triton itself reads it.

Triton takes "1", "true", "yes" and "on" in any case (triton.knobs.getenv_bool): with TRITON_INTERPRET=true Triton
interpreted while the launcher, reading only "1", refused CPU tensors as if the interpreter were off."""

from __future__ import annotations

import os

TRUE_VALUES = ("1", "true", "yes", "on")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in TRUE_VALUES
