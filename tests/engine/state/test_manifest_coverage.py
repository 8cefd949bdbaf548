"""A checkpoint's files that a resume reads must be ones its manifest verifies. Before, a file the manifest did not
name was read unverified: an optimizer.pt copied in from an older checkpoint with its entry removed resumed silently
with the wrong AdamW state, and a copied rng-1.pt read as "saved by 2 data-parallel processes"."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.state import checkpoint as ckpt

# Files the engine reads from a checkpoint (at the top, or anywhere in model/, sharded/, history/)...
READ = st.one_of(
    st.sampled_from(["optimizer.pt", "scheduler.pt", "config.yaml"]),
    st.integers(0, 64).map(lambda n: f"rng-{n}.pt"),
    st.integers(0, 8).map(lambda n: f"optimizer-tp{n}.pt"),
    st.tuples(st.sampled_from(["model", "history", "sharded"]),
              st.sampled_from(["model.safetensors", "pytorch_model.bin", "config.json", "metrics.jsonl",
                               "__0_0.distcp", ".metadata", "sub/tokenizer.json"])).map("/".join))
# ...and files it does not read: a user's notes beside them, a file manager's hidden files.
NOT_READ = st.one_of(
    st.sampled_from(["notes.txt", "README.md", ".DS_Store", "optimizer.pt.bak", "rng-0.pt~"]),
    st.tuples(st.sampled_from(["model", "history", "sharded", "extra"]),
              st.sampled_from([".DS_Store", ".ipynb_checkpoints/x.json", "._model.safetensors"])).map("/".join))


def _checkpoint(directory: Path) -> Path:
    """A checkpoint the engine could have written: its trainer state, an optimizer file, its manifest."""
    directory.mkdir(parents=True)
    (directory / ckpt.STATE_FILE).write_text(json.dumps({"step": 3, "sampler": {"epoch": 0, "offset": 0}}))
    (directory / "optimizer.pt").write_bytes(b"saved with the checkpoint")
    ckpt.write_manifest(directory)
    return directory


def _add(directory: Path, name: str) -> None:
    file = directory / name
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(b"added after the save")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=READ)
def test_a_file_the_resume_reads_must_be_in_the_manifest(name, tmp_path_factory):
    directory = _checkpoint(tmp_path_factory.mktemp("run") / "checkpoint-000003")
    if name == "optimizer.pt":  # the saved file's entry removed (the file itself swapped, say)
        manifest = json.loads((directory / ckpt.MANIFEST_FILE).read_text())
        del manifest[name]
        (directory / ckpt.MANIFEST_FILE).write_text(json.dumps(manifest))
    else:
        _add(directory, name)
    problems = ckpt.checkpoint_problems(directory)
    assert problems == [f"{name} is not among the files {ckpt.MANIFEST_FILE} verifies (added after the save, or its "
                        f"entry removed?), so it cannot be verified"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(NOT_READ, min_size=1, max_size=3, unique=True))
def test_files_the_engine_does_not_read_leave_the_checkpoint_intact(names, tmp_path_factory):
    directory = _checkpoint(tmp_path_factory.mktemp("run") / "checkpoint-000003")
    for name in names:
        _add(directory, name)
    assert ckpt.checkpoint_problems(directory) == []
