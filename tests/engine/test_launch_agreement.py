"""What the processes of a launched run must start from alike: the fingerprint each process contributes and the one
line a difference becomes. Before, processes given other flags, config files, data, model files, reward code or
packages (each host's own copies, in a multi-node launch) trained on silently, DDP averaging the gradients of
different objectives, or waited in a collective for run.distributed_timeout_s."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.config import config_from_dict
from grpo_engine.steps.rewards import NamedReward
from grpo_engine.launch_agreement import (PER_PROCESS_SETTINGS, file_digest, first_disagreement, flat_settings,
                                          launch_fingerprint, resume_label)

from processes import subprocess_env, torchrun
from repo_paths import ROOT, SUPPORT

REWARD = "def own(prompts, completions, **kwargs):\n    return [{} + 0.1 * len(c) for c in completions]\n"
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
    values = {p[changed[0]] for p in processes}
    short = {" ".join(value.split()) for value in values}
    short = {value if len(value) <= 80 else value[:77] for value in short}
    if len(short) < len(values):  # apart only in spacing or past the cut: each value shown whole, as a literal
        short = {repr(value) for value in values}
    for value in short:
        assert value in message
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


def _reward_from(path: Path, text: str) -> NamedReward:
    """A user reward function defined in its own file at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    namespace: dict = {}
    exec(compile(text, str(path), "exec"), namespace)  # its code object names the file, as an import's does
    namespace["own"].__module__ = "rewards_mod"
    return NamedReward("own", namespace["own"], 1.0)


def test_data_reward_code_resume_point_and_packages_must_agree(monkeypatch, tmp_path: Path):
    config = config_from_dict({})
    data = {"train": {"source": "x", "rows": 9, "sha256": "a" * 64}}
    here = [_reward_from(tmp_path / "a" / "rewards_mod.py", REWARD.format(0.0))]
    base = launch_fingerprint(config, None, data, "checkpoint-000002 (step 2)", here)
    elsewhere = [_reward_from(tmp_path / "b" / "rewards_mod.py", REWARD.format(0.0))]  # another host's path
    assert first_disagreement([base, launch_fingerprint(config, None, data, "checkpoint-000002 (step 2)",
                                                        elsewhere)]) is None
    changed = [_reward_from(tmp_path / "c" / "rewards_mod.py", REWARD.format(1.0))]
    for name, other, rewards in (("train data", {"train": {**data["train"], "rows": 8}}, here),
                                 ("reward code", data, changed)):
        message = first_disagreement([base, launch_fingerprint(config, None, other, "checkpoint-000002 (step 2)",
                                                               rewards)])
        assert message.startswith(f"the processes of this launch disagree on {name}: ")
    message = first_disagreement([base, launch_fingerprint(config, None, data, None, here)])
    assert "disagree on resume point" in message and "a fresh start" in message
    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(__version__="0.0.1"))
    message = first_disagreement([base, launch_fingerprint(config, None, data, "checkpoint-000002 (step 2)", here)])
    assert "disagree on package transformers" in message and "0.0.1" in message


def test_a_fresh_start_beside_a_resume_is_a_difference_and_alike_failures_are_left_to_the_resume(tmp_path: Path):
    """Resolved before the resume's own checks: one process starting fresh where another resumes is a difference
    (before, the fresh one refused a finished run directory and the other lost it); processes that all find no
    checkpoint agree, and the resume's own check then says why on each."""
    config = config_from_dict({})
    labels = {resume: resume_label(resume, tmp_path / "run") for resume in (None, "latest", str(tmp_path / "nope"))}
    assert labels[None] == "none (a fresh start)" and labels["latest"] == labels[str(tmp_path / "nope")]
    fresh, resumed = (launch_fingerprint(config, None, {}, labels[r]) for r in (None, "latest"))
    assert first_disagreement([fresh, resumed]).startswith("the processes of this launch disagree on resume point: ")
    assert first_disagreement([resumed, launch_fingerprint(config, None, {}, labels["latest"])]) is None


def test_a_missing_model_directory_is_left_to_the_loader(tmp_path: Path):
    fingerprint = launch_fingerprint(config_from_dict({}), str(tmp_path / "absent"), {}, None)
    assert not any(name.startswith("model file") for name in fingerprint)


ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(3) for b in range(3)]
# (what differs, how process 1's copy differs or the flag's two values, the name the refusal gives it)
LAUNCH_KINDS = [("flag", ("--optim.learning_rate", "1e-5", "2e-5"), "setting optim.learning_rate"),
                ("flag", ("--run.max_steps", "1", "2"), "setting run.max_steps"),
                ("flag", ("--loss.loss_type", "dapo", "grpo"), "setting loss.loss_type"),
                ("data", ROWS[::-1], "train data"), ("data", ROWS[:-1], "train data"),
                ("data", ROWS[:-1] + [{"prompt": "9+9=", "answer": "18"}], "train data"),
                ("model", 1, "model file model.safetensors"), ("reward", 1.0, "reward code")]


def _process_directory(root: Path, rank: int, kind: str, change) -> list[str]:
    """Process `rank`'s own directory (process 1's copy changed as `kind` says) and the flags that read it."""
    import json

    from grpo_engine.data.demo_task import build_char_tokenizer, build_tiny_model

    own = root / f"r{rank}"
    own.mkdir(parents=True)
    rows = change if kind == "data" and rank == 1 else ROWS
    (own / "data.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (own / "rewards_mod.py").write_text(REWARD.format(change if kind == "reward" and rank == 1 else 0.0))
    flags = ["--data.path", "data.jsonl", "--rewards.functions", "[math_accuracy, rewards_mod:own]"]
    if kind == "model":
        tokenizer = build_char_tokenizer()
        build_tiny_model(tokenizer, seed=change if rank == 1 else 0).save_pretrained(own / "model")
        tokenizer.save_pretrained(own / "model")
        flags += ["--model", "model"]
    return flags


@pytest.mark.slow
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(LAUNCH_KINDS))
def test_a_launch_whose_processes_differ_stops_on_every_process_naming_it(case, tmp_path_factory):
    """2 gloo processes under torchrun, each in its own directory: a flag, the data file, the model's weights or
    the reward module differing between them stops both before any work, each naming it and both values."""
    kind, change, name = case
    root = tmp_path_factory.mktemp("launch")
    flags = [_process_directory(root, rank, kind, change) for rank in (0, 1)][0]
    if kind == "flag":
        flags += [change[0], f"{{{change[1]}|{change[2]}}}"]
    run_dir = root / "run"
    base = ["--run.output_dir", str(run_dir), "--run.max_steps", "1", "--run.progress_bar", "false", "--run.plot",
            "false", "--run.warm_start_steps", "0", "--rollout.num_generations", "4", "--rollout.max_new_tokens", "4",
            "--optim.per_device_train_batch_size", "2", "--run.distributed_timeout_s", "60"]
    result = subprocess.run(torchrun(str(SUPPORT / "per_rank_launch.py"), str(root), "train", *base, *flags),
                            env=subprocess_env(), timeout=240, capture_output=True, text=True, cwd=ROOT)
    assert result.returncode != 0, result.stderr[-3000:]
    # one line on each process; the two share torchrun's stderr, where one's line may land before the other's newline
    refusals = [piece.split("\n")[0] for piece in result.stderr.split("grpo-engine: config error: ")[1:]
                if piece.startswith("the processes of this launch disagree on ")]
    assert len(refusals) == 2, result.stderr[-3000:]
    assert all(line.startswith(f"the processes of this launch disagree on {name}: ") and "process 0 has " in line
               and "process 1 has " in line for line in refusals), refusals
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "metrics.jsonl").exists()


HOLDERS = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=80).filter(
    lambda text: text.strip() != "")


@settings(max_examples=40, deadline=None)
@given(holder=HOLDERS, other=st.one_of(st.none(), st.just(""), HOLDERS), shape=st.sampled_from(["file", "dir", "gone"]))
def test_processes_that_reach_other_run_directories_are_named(holder, other, shape, tmp_path_factory):
    """Process 0 holds the run directory (its lock file names it) before the processes join; a process that reads
    another directory (a relative path from another working directory, a path on its own host's disk) sees another
    holder, no lock file or no directory. Before, the run went on until that process missed a file (the demo's
    base_model/), with a message about the model."""
    from grpo_engine.launch_agreement import RUN_DIRECTORY
    from grpo_engine.state.run_lock import LOCK_FILE

    root = tmp_path_factory.mktemp("hosts")
    held, elsewhere = root / "host0" / "out", root / "host1" / "out"
    held.mkdir(parents=True)
    (held / LOCK_FILE).write_text(holder + "\n")
    if shape != "gone":
        elsewhere.mkdir(parents=True)
        if shape == "file" and other is not None:
            (elsewhere / LOCK_FILE).write_text(other)
    config = config_from_dict({})
    mine, same, theirs = (launch_fingerprint(config, None, {}, None, run_dir=path) for path in (held, held, elsewhere))
    assert first_disagreement([mine, same]) is None
    agrees = shape == "file" and other is not None and other.strip() == holder.strip()
    message = first_disagreement([mine, theirs])
    assert (message is None) == agrees
    if message is not None:
        assert message.startswith(f"the processes of this launch disagree on {RUN_DIRECTORY}: ") and "\n" not in message
        assert "process 0 has a directory held by " in message and "process 1 has " in message
