"""The typed schema of a checkpoint's trainer_state.json: what the engine writes there, and nothing else.

A resume reads the step, the prompt sampler's position and the token count from it. The manifest's checksums catch
a damaged file, but not one edited by hand with the manifest rewritten, nor one a newer engine wrote: without a
schema, `"offset": -5` or `"sampler"` missing resumed silently from another position or failed after the model
loaded with a KeyError. Validated when a checkpoint is checked (before anything loads), each refusal is one line
naming the field.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SamplerPosition(_Strict):
    epoch: StrictInt = Field(ge=0)
    offset: StrictInt = Field(ge=0)


class Fingerprint(_Strict):
    """data_fingerprint / code_fingerprint: what a resume compares the data and reward code with."""
    source: StrictStr
    rows: StrictInt = Field(ge=0)
    sha256: StrictStr = Field(pattern=r"^[0-9a-f]{64}$")


class TrainerState(_Strict):
    step: StrictInt = Field(ge=0)
    sampler: SamplerPosition
    num_tokens: StrictInt = Field(default=0, ge=0)  # absent in checkpoints saved before it was counted
    data: Optional[dict[StrictStr, Fingerprint]] = None  # absent in checkpoints saved before fingerprints


def trainer_state_problem(state: Any) -> Optional[str]:
    """Why `state` (trainer_state.json as read) is not what the engine writes, in one line; None when it is."""
    if not isinstance(state, dict):
        return f"holds a JSON {type(state).__name__}, not the engine's object of step, sampler, num_tokens and data"
    try:
        TrainerState.model_validate(state)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "the file"
        if error["type"] == "extra_forbidden":
            return f"has a field {where!r} the engine does not write (saved by another version, or edited?)"
        if error["type"] == "missing":
            return f"has no {where!r}, which the engine writes and a resume reads"
        return f"{where!r} is {error.get('input')!r:.60}: {error['msg'][:120].lower()}"
    return None
