"""A model or data setting that names a local path through a link that leads nowhere (a dangling link, one to itself,
a loop of two, a directory link on the way that is gone), with a name shaped like a Hub id ORG/NAME or not: refused
in one line naming the key and the link, never read as a Hub id (which would download another repository of that
name); a path through links that resolve, and a Hub id with no local file of its name, are accepted as before
(hypothesis). Before, `org/dangling` went to the Hub."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.config import ConfigError, load_config
from grpo_engine.config.schema import broken_link

# (how the name is laid out locally, whether it resolves to a local file or directory)
LAYOUTS = {"a dangling link": False, "a link to itself": False, "a loop of two links": False,
           "through a directory link that is gone": False, "a link to a file or directory": True,
           "through a directory link that resolves": True, "no local file (a Hub id)": None}
KEYS = {"data.path": "file", "data.eval_path": "file", "model.name_or_path": "directory"}


def _lay_out(layout: str, kind: str) -> str:
    """The setting's value, laid out in the working directory as `layout` says."""
    os.makedirs("org", exist_ok=True)
    target = "target"
    if kind == "directory":
        os.makedirs(target, exist_ok=True)
    else:
        open(target, "w").write('{"prompt": "1+1=", "answer": "2"}\n')
    if layout == "a dangling link":
        os.symlink("/nonexistent/gone", "org/name")
    elif layout == "a link to itself":
        os.symlink("name", "org/name")
    elif layout == "a loop of two links":
        os.symlink("other", "org/name")
        os.symlink("name", "org/other")
    elif layout == "through a directory link that is gone":
        os.rmdir("org")
        os.symlink("/nonexistent/dir", "org")
    elif layout == "a link to a file or directory":
        os.symlink(os.path.abspath(target), "org/name")
    elif layout == "through a directory link that resolves":
        os.rmdir("org")
        os.makedirs("real")
        os.symlink(os.path.abspath(target), "real/name")
        os.symlink("real", "org")
    return "org/name"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.sampled_from(sorted(LAYOUTS)), key=st.sampled_from(sorted(KEYS)))
def test_a_path_through_a_link_that_leads_nowhere_is_refused_not_read_as_a_hub_id(layout, key, tmp_path_factory,
                                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path_factory.mktemp("links"))
    value = _lay_out(layout, KEYS[key])
    overrides = {key: value, **({"data.path": "target"} if key == "data.eval_path" else {})}
    try:
        config = load_config(overrides=overrides)
    except ConfigError as exc:
        message = str(exc)
        assert LAYOUTS[layout] is False, (layout, message)
        assert "\n" not in message and message.startswith(key) and "is a link to" in message, message
        return
    assert LAYOUTS[layout] is not False, layout
    section, name = key.split(".", 1)
    assert getattr(getattr(config, section), name) == value


def test_a_hub_id_with_no_local_file_is_still_one():
    assert broken_link(Path("org/name-that-is-not-here")) is None
    with pytest.raises(ConfigError, match="data.path: expected an existing file"):
        load_config(overrides={"data.path": "not-a-hub-id-and-not-here.jsonl"})
