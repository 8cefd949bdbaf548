"""A DatasetDict directory (datasets.save_to_disk of train / test / validation splits) is read at the split its
setting names, data.split for data.path and data.eval_split for data.eval_path, as a Hub dataset is. Before, its
'train' split was read for both: an evaluation of a DatasetDict directory scored the training rows, silently, and
the settings that would choose the split were said to change nothing."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.config import load_config
from grpo_engine.config.applicability import inapplicable_settings
from grpo_engine.data.prompts import DataError, load_prompt_rows
from grpo_engine.tools.eval_settings import unread_eval_flags

datasets = pytest.importorskip("datasets")

SPLIT_NAMES = ["train", "test", "validation", "dev", "heldout"]


def _save(directory, splits: list[str]) -> None:
    datasets.DatasetDict({name: datasets.Dataset.from_list([{"prompt": f"a {name} prompt", "answer": name}])
                          for name in splits}).save_to_disk(str(directory))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(splits=st.lists(st.sampled_from(SPLIT_NAMES), min_size=1, max_size=3, unique=True),
       asked=st.sampled_from(SPLIT_NAMES))
def test_a_dataset_dict_directory_is_read_at_the_split_asked_for(splits, asked, tmp_path_factory):
    directory = tmp_path_factory.mktemp("dataset_dict")
    _save(directory, splits)
    try:
        rows = load_prompt_rows(str(directory), "prompt", None, None, asked)
    except DataError as exc:
        message = str(exc)
        assert asked not in splits, message
        assert "\n" not in message and repr(asked) in message and all(name in message for name in splits), message
        assert "data.split" in message and "data.eval_split" in message, message
        return
    assert asked in splits and [row["answer"] for row in rows] == [asked]


def test_the_split_settings_are_read_for_a_dataset_dict_directory(tmp_path):
    _save(tmp_path / "splits", ["train", "validation"])
    overrides = {"data.path": str(tmp_path / "splits"), "data.eval_path": str(tmp_path / "splits"),
                 "data.eval_split": "validation"}
    config = load_config(overrides=overrides)
    notes = inapplicable_settings(config, load_config(overrides={}))
    assert not [note for note in notes if "split" in note], notes
    # `grpo-engine eval --data DIR --data.eval_split validation` reads it too (a file's split it does not)
    assert unread_eval_flags(["data.eval_split"], config, True, str(tmp_path / "splits")) == []
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1="}\n')
    assert len(unread_eval_flags(["data.eval_split"], config, True, str(tmp_path / "d.jsonl"))) == 1
