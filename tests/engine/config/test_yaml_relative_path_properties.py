"""Property test: a data path in a YAML file that the schema refuses as a flag is refused the same way from the file.
Relative data paths in a YAML file are read next to it; a blank one (`path: ''`, `eval_path: "  "`) was joined to
the file's directory first, so the run read that directory (the config beside it included) as its dataset."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_engine.config import ConfigError, load_config
from grpo_engine.config.strict_yaml import dump_yaml

DERANDOMIZE = bool(os.environ.get("CI"))
BLANK = st.text(st.sampled_from(" \t\n\r\u00a0\u2003"), max_size=4)


def _refusal(**load) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(**load)
    return str(caught.value)


@settings(max_examples=60, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["path", "eval_path"]), value=BLANK)
def test_a_blank_data_path_in_a_yaml_file_is_refused_as_the_flag_is(key, value, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(dump_yaml({"data": {key: value}}))
    from_file = _refusal(path=config)
    assert from_file == _refusal(overrides={f"data.{key}": value}), from_file
    assert from_file.startswith(f"data.{key}: expected a non-empty text"), from_file
