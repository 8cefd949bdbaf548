"""Whether a checkpoint's saved config.yaml holds this engine's settings: no setting it does not know, none of its
own missing (but for those that may change on resume).

A resume compares the saved options with the run's, key by key. A key only one side has was listed as a change with
the other side None, and the advice to resume "with the saved values" was a dead end: `--run.colour red` (a key
added by hand) is an unknown flag, `--optim.padding_free null` (a setting an earlier engine did not have) is not a
value the setting takes. What such a file says is that another version of the engine saved it (or a person edited
it), so that this one cannot tell what the run did with those settings: said in one line naming them.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..config import SHARED_SETTINGS, leaf_keys
from .checkpoint_error import CheckpointError


def _holds(tree: dict[str, Any], dotted: str) -> bool:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _keys(tree: dict[str, Any], prefix: str = "") -> Iterable[str]:
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from _keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def check_saved_settings(tree: dict[str, Any], source: str, may_change: Iterable[str]) -> None:
    """CheckpointError in one line naming `source` and the settings, when the saved `tree` (a mapping of sections)
    has a setting this engine does not know, or lacks one of its settings that may not change on resume. A
    setting's own mapping (loss.params) is a value: its keys are not settings."""
    settings = leaf_keys()
    unknown = [key for key in _keys(tree) if key not in SHARED_SETTINGS and not any(
        key == setting or key.startswith(f"{setting}.") for setting in settings)]
    missing = [setting for setting in settings if setting not in may_change and not _holds(tree, setting)]
    if not unknown and not missing:
        return
    found = [f"settings this version does not have ({', '.join(unknown)})"] * bool(unknown) + \
        [f"no value for settings this version has ({', '.join(missing)})"] * bool(missing)
    raise CheckpointError(f"{source} has {' and '.join(found)}: another version of the engine saved it (or it was "
                          f"edited), so this version cannot tell what the run did with them; continue the run with "
                          f"the version that saved it, or start a new run in another --output-dir")
