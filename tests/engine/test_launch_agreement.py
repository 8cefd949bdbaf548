"""What the processes of a launched run must start from alike: the fingerprint each process contributes and the one
line a difference becomes. Before, processes given other flags, config files, data, model files, reward code or
packages (each host's own copies, in a multi-node launch) trained on silently, DDP averaging the gradients of
different objectives, or waited in a collective for run.distributed_timeout_s."""

from __future__ import annotations

import sys
import types
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.config import config_from_dict
from grpo_engine.launch_agreement import (PER_PROCESS_SETTINGS, file_digest, first_disagreement, flat_settings,
                                          launch_fingerprint)

NAMES = st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=1, max_size=12)
VALUES = st.text(max_size=200)

# (dotted key, nested override): settings a user sets per host by a flag or a config file
CHANGES = [("optim.learning_rate", {"optim": {"learning_rate": 3e-4}}), ("run.seed", {"run": {"seed": 7}}),
           ("loss.loss_type", {"loss": {"loss_type": "grpo"}}), ("loss.beta", {"loss": {"beta": 0.04}}),
           ("rollout.temperature", {"rollout": {"temperature": 0.7}}), ("run.max_steps", {"run": {"max_steps": 9}}),
           ("run.save_steps", {"run": {"save_steps": 3}}), ("run.output_dir", {"run": {"output_dir": "elsewhere"}}),
           ("data.shuffle", {"data": {"shuffle": False}}), ("rollout.max_new_tokens", {"rollout": {"max_new_tokens": 9}}),
           ("rewards.functions", {"rewards": {"functions": ["math_accuracy", "format"]}}),
           ("run.distributed_timeout_s", {"run": {"distributed_timeout_s": 60.0}}),
           ("run.resume", {"run": {"resume": "latest"}})]


@st.composite
def fingerprints(draw) -> tuple[list[dict[str, str]], list[str]]:
    """The fingerprints of 2-5 processes and the names whose values were changed on some of them, in order."""
    base = draw(st.dictionaries(NAMES, VALUES, min_size=1, max_size=8))
    processes = [dict(base) for _ in range(draw(st.integers(2, 5)))]
    changed = draw(st.lists(st.sampled_from(sorted(base)), unique=True, max_size=3))
    for name in changed:
        for rank in draw(st.sets(st.integers(0, len(processes) - 1), min_size=1, max_size=len(processes) - 1)):
            processes[rank][name] = draw(VALUES.filter(lambda v, old=base[name]: v != old))
    return processes, [name for name in base if name in changed]


@settings(max_examples=200, deadline=None)
@given(case=fingerprints())
def test_the_first_difference_is_one_line_naming_it_and_every_value(case):
    processes, changed = case
    message = first_disagreement(processes)
    if not changed:
        assert message is None
        return
    assert message is not None and "\n" not in message
    assert message.startswith(f"the processes of this launch disagree on {changed[0]}: ")
    values = {" ".join(p[changed[0]].split()) for p in processes}
    assert len(values) > 1
    for value in values:
        assert (value if len(value) <= 80 else value[:77]) in message
    for rank in range(len(processes)):
        assert f" {rank}" in message


def test_an_item_one_process_lacks_is_a_difference():
    message = first_disagreement([{"model file a": "1 bytes"}, {"model file a": "1 bytes", "model file b": "2"}])
    assert message is not None and "model file b" in message and "(not there)" in message


@settings(max_examples=30, deadline=None)
@given(change=st.sampled_from(CHANGES), extra=st.sampled_from(sorted(PER_PROCESS_SETTINGS)))
def test_every_setting_but_the_per_process_ones_must_agree(change, extra):
    key, override = change
    section, name = extra.split(".")
    per_process = {"run.num_threads": 2, "run.progress_bar": False}[extra]
    plain = launch_fingerprint(config_from_dict({}), None, {}, None)
    own = launch_fingerprint(config_from_dict({section: {name: per_process}}), None, {}, None)
    assert first_disagreement([plain, own]) is None  # a host's own thread count, who draws the bar
    other = launch_fingerprint(config_from_dict(override), None, {}, None)
    assert first_disagreement([plain, other]).startswith(f"the processes of this launch disagree on setting {key}: ")
    assert set(flat_settings(config_from_dict({}))).isdisjoint(PER_PROCESS_SETTINGS)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.sampled_from([0, 1, 1000, 3 << 20]), where=st.floats(0, 1), file=st.sampled_from(
    ["model.safetensors", "config.json", "tokenizer.json"]), grow=st.booleans())
def test_model_files_that_differ_are_named_and_copies_elsewhere_agree(size, where, file, grow, tmp_path_factory):
    """A change within a model file's first or last MiB, or of its size, is named; the same files in another
    directory (another host's cache) agree."""
    one, two = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    content = bytes(i % 251 for i in range(size))
    for directory in (one, two):
        for name in ("model.safetensors", "config.json", "tokenizer.json"):
            (directory / name).write_bytes(content)
    config = config_from_dict({})
    assert first_disagreement([launch_fingerprint(config, str(d), {}, None) for d in (one, two)]) is None
    changed = bytearray(content)
    if grow or not changed:
        changed += b"\0"
    else:  # inside the ends the digest reads
        position = int(where * (len(changed) - 1))
        position = position if position < (1 << 20) else len(changed) - 1 - (position % (1 << 20))
        changed[position] ^= 0xFF
    (two / file).write_bytes(bytes(changed))
    message = first_disagreement([launch_fingerprint(config, str(d), {}, None) for d in (one, two)])
    assert message is not None and message.startswith(f"the processes of this launch disagree on model file {file}: ")
    assert file_digest(one / file) in message


def test_data_reward_code_resume_point_and_packages_must_agree(monkeypatch):
    config = config_from_dict({})
    data = {"train": {"source": "x", "rows": 9, "sha256": "a" * 64}, "rewards": {"rows": 1, "sha256": "b" * 64}}
    base = launch_fingerprint(config, None, data, "checkpoint-000002 (step 2)")
    for name, other in (("train data", {**data, "train": {**data["train"], "rows": 8}}),
                        ("reward code", {**data, "rewards": {"rows": 1, "sha256": "c" * 64}})):
        message = first_disagreement([base, launch_fingerprint(config, None, other, "checkpoint-000002 (step 2)")])
        assert message.startswith(f"the processes of this launch disagree on {name}: ")
    message = first_disagreement([base, launch_fingerprint(config, None, data, None)])
    assert "disagree on resume point" in message and "a fresh start" in message
    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(__version__="0.0.1"))
    message = first_disagreement([base, launch_fingerprint(config, None, data, "checkpoint-000002 (step 2)")])
    assert "disagree on package transformers" in message and "0.0.1" in message


def test_a_missing_model_directory_is_left_to_the_loader(tmp_path: Path):
    fingerprint = launch_fingerprint(config_from_dict({}), str(tmp_path / "absent"), {}, None)
    assert not any(name.startswith("model file") for name in fingerprint)
