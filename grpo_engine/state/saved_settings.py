"""Whether a checkpoint's saved config.yaml holds this engine's settings: no setting it does not know, none of its
own missing (but for those that may change on resume).

A resume compares the saved options with the run's, key by key. A key only one side has was listed as a change with
the other side None, and the advice to resume "with the saved values" was a dead end: `--run.colour red` (a key
added by hand) is an unknown flag, `--optim.padding_free null` (a setting an earlier engine did not have) is not a
value the setting takes. What such a file says is that another version of the engine saved it (or a person edited
it), so that this one cannot tell what the run did with those settings: said in one line naming them. The exception
is a setting added since checkpoints were first saved whose absence says what the run did (ADDED_SETTINGS): the
value that does what the engine did before it existed stands in for it.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..config import SHARED_SETTINGS, leaf_keys
from .checkpoint_error import CheckpointError

# Settings this engine added after its checkpoints' format was first saved, each with the value that does what the
# engine did before it existed: a config saved then lacks the key, and the run it records trained as that value does.
# (optim.master_weights: the earlier engine stepped every trained weight in its own dtype.)
ADDED_SETTINGS: dict[str, Any] = {"optim.master_weights": "none"}


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
    missing = [setting for setting in settings if setting not in may_change and setting not in ADDED_SETTINGS
               and not _holds(tree, setting)]
    if not unknown and not missing:
        return
    found = [f"settings this version does not have ({', '.join(unknown)})"] * bool(unknown) + \
        [f"no value for settings this version has ({', '.join(missing)})"] * bool(missing)
    raise CheckpointError(f"{source} has {' and '.join(found)}: another version of the engine saved it (or it was "
                          f"edited), so this version cannot tell what the run did with them; continue the run with "
                          f"the version that saved it, or start a new run in another --output-dir")


def added_settings_missing(tree: dict[str, Any]) -> dict[str, Any]:
    """{setting: the value the run trained as} for the ADDED_SETTINGS the saved `tree` lacks."""
    return {key: value for key, value in ADDED_SETTINGS.items() if not _holds(tree, key)}
