"""How a data file's name is read. Its suffix names its format in any case (DATA.JSONL, as Windows tools write it;
.ndjson, JSONL's other name), where an upper-case suffix was refused as an unsupported format. A name shaped like a
Hub id ORG/NAME that ends in a data file's suffix and names nothing is refused in one line as a file that is not
there, where `data/trian.jsonl` (a typo) was read as a Hub dataset id and the run failed on the network or the Hub
cache (hypothesis draws the names)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.config import ConfigError, load_config
from grpo_engine.data.prompts import DataError, load_prompt_rows

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]


def _in_any_case(draw, text: str) -> str:
    return "".join(c.upper() if draw(st.booleans()) else c for c in text)


@st.composite
def data_file_names(draw) -> tuple[str, str]:
    """(a file name, its format)."""
    kind = draw(st.sampled_from(["jsonl", "ndjson", "json", "parquet"]))
    stem = draw(st.sampled_from("abcXYZ")) + draw(st.text(alphabet="abcXYZ_-0", max_size=5))
    return f"{stem}.{_in_any_case(draw, kind)}", kind


def _write(path, kind: str) -> None:
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(ROWS), path)
    elif kind == "json":
        path.write_text(json.dumps(ROWS))
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))


@SETTINGS
@given(named=data_file_names())
def test_a_data_file_loads_by_its_suffix_in_any_case(named, tmp_path_factory):
    name, kind = named
    directory = tmp_path_factory.mktemp("data")
    _write(directory / name, kind)
    assert load_prompt_rows(str(directory / name), "prompt", None) == ROWS
    assert load_prompt_rows(str(directory), "prompt", None) == ROWS  # a directory of that one shard


SUFFIXES = [".jsonl", ".ndjson", ".json", ".parquet", ".csv", ".txt", ".gz", ".zip"]
WORD = st.text(alphabet="abcdefgh0123_-", min_size=1, max_size=8).filter(
    lambda w: w[0] not in "_-" and w[-1] != "-" and "--" not in w)  # an id's NAME (is_hub_id)


@st.composite
def missing_names(draw) -> tuple[str, bool]:
    """(an ORG/NAME-shaped name that names no file, whether it is a local path all the same)."""
    suffix = draw(st.one_of(st.none(), st.sampled_from(SUFFIXES)))
    name = f"{draw(st.sampled_from(['data', 'org']))}/{draw(WORD)}"
    if suffix is not None:
        name += _in_any_case(draw, suffix)
    return name, suffix is not None


@SETTINGS
@given(drawn=missing_names())
def test_a_local_path_shaped_like_a_hub_id_that_names_nothing_is_refused_as_a_missing_file(drawn, tmp_path,
                                                                                       monkeypatch):
    name, local = drawn
    (tmp_path / "data").mkdir(exist_ok=True)
    monkeypatch.chdir(tmp_path)
    if not local:  # a Hub id: the settings take it, and the download says what it finds
        assert load_config(overrides={"data.path": name}).data.path == name
        return
    with pytest.raises(ConfigError) as refused:
        load_config(overrides={"data.path": name})
    message = str(refused.value)
    assert "\n" not in message and message.startswith("data.path: ") and repr(name) in message, message
    assert "there is none by that name" in message and "not a Hub dataset id" in message, message


@pytest.mark.parametrize("inside", [["main/train-00000-of-00001.parquet"], ["data/train.jsonl", "data/test.jsonl"],
                                    ["train.jsonl"]])
def test_a_copy_of_a_hub_dataset_repository_is_named_as_one(inside, tmp_path):
    """`huggingface-cli download --repo-type dataset ORG/NAME --local-dir copy` writes the dataset card next to
    the data: the refusal says what the directory is and what to name instead."""
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "README.md").write_text("---\nconfigs:\n- config_name: main\n---\n")
    for name in inside:
        (tmp_path / "copy" / name).parent.mkdir(parents=True, exist_ok=True)
        _write(tmp_path / "copy" / name, name.rsplit(".", 1)[1])
    with pytest.raises(DataError) as refused:
        load_prompt_rows(str(tmp_path / "copy"), "prompt", None)
    message = str(refused.value)
    assert "\n" not in message and "README.md" in message and "a copy of a Hub dataset repository" in message
    assert "Hub id ORG/NAME" in message, message
