"""A data or model location shaped like a Hub id ORG/NAME whose first component is a local directory, but which
names nothing in it (`data/my_data`, `models/qwen-sft`: a directory not made yet, a typo) is one line naming the key
and the directory, when the config loads from a flag or from a YAML file beside that directory. Before, it was read as
the Hub repository NAME of an organisation ORG and the run failed on the network, never saying the path was not
there. A Hub id whose first component is no local directory still loads as an id."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from grpo_engine.config import ConfigError, load_config

NAMES = st.from_regex(r"\A[A-Za-z0-9]([A-Za-z0-9_-]{0,14}[A-Za-z0-9])?\Z")  # a Hub id's rule: no trailing - or .
KEYS = st.sampled_from(["data.path", "data.eval_path", "model.name_or_path"])


def overrides(key: str, value: str) -> dict:
    # data.eval_path is read beside a training set (a Hub id here, which loads)
    return {"data.path": "org-that-is-no-directory/train", key: value} if key == "data.eval_path" else {key: value}


@settings(max_examples=25, deadline=None)
@given(key=KEYS, directory=NAMES, name=NAMES, from_yaml=st.booleans())
def test_a_missing_path_under_a_local_directory_is_one_line(key, directory, name, from_yaml):
    with tempfile.TemporaryDirectory() as root:
        here = Path(root)
        (here / "configs" / directory).mkdir(parents=True)
        (here / directory).mkdir()
        cwd = os.getcwd()
        os.chdir(here)
        try:
            value = f"{directory}/{name}"
            # A YAML file's data paths are read next to it (the command runs from elsewhere); a model's from here.
            if from_yaml and key.startswith("data."):
                section, leaf = key.split(".")
                text = "".join(f"  {k.split('.')[1]}: {v}\n" for k, v in overrides(key, value).items())
                (here / "configs" / "run.yaml").write_text(f"{section}:\n{text}")
                os.chdir(here / "configs" / directory)
                call = lambda: load_config(here / "configs" / "run.yaml")  # noqa: E731
            else:
                call = lambda: load_config(None, overrides(key, value))  # noqa: E731
            with pytest.raises(ConfigError) as raised:
                call()
        finally:
            os.chdir(cwd)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(key), message
    if from_yaml and key.startswith("data."):  # read next to the YAML file: named there, as a path
        assert f"{directory}/{name}" in message and "configs" in message, message
    else:
        assert f"({directory}/ is a directory here, so this is a path in it, not a Hub " in message, message


@settings(max_examples=25, deadline=None)
@given(key=KEYS, org=NAMES, name=NAMES)
def test_a_hub_id_whose_organisation_is_no_local_directory_loads(key, org, name):
    with tempfile.TemporaryDirectory() as root:
        cwd = os.getcwd()
        os.chdir(root)
        try:
            config = load_config(None, overrides(key, f"{org}/{name}"))
        finally:
            os.chdir(cwd)
    section, leaf = key.split(".")
    assert getattr(getattr(config, section), leaf) == f"{org}/{name}"
