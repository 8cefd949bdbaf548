"""The run directory is the engine's: what it finds there that it did not write (a hand-edited log line, a
checkpoint moved away and linked back, a backup copy, data regenerated under the same path, the leftovers of a
failed start) is tolerated by design or refused in one line naming the file and the way out."""

from __future__ import annotations

import json
import shutil

import pytest

from grpo_engine.cli import main
from grpo_engine.state.run_files import MANIFEST
from test_hostile_runs import SMALL, _fails_in_one_line

FAST = [*SMALL, "--rewards.functions", "[math_accuracy]"]
# with a data file: the built-in task's settings would only draw warnings
ON_DATA = [arg for i, arg in enumerate(FAST) if "builtin" not in arg and (i == 0 or "builtin" not in FAST[i - 1])]


def _data(path, rows: int, offset: int = 0):
    rows = [{"prompt": f"{i % 3}+{(i + offset) % 3}=", "answer": str(i % 3 + (i + offset) % 3)} for i in range(rows)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_a_moved_and_linked_checkpoint_a_backup_copy_and_an_edited_log_line_do_not_stop_a_resume(tmp_path,
                                                                                                 capsys):
    run_dir = tmp_path / "run"
    assert main(["train", "--output-dir", str(run_dir), *FAST, "--run.max_steps", "2", "--run.save_steps", "1"]) == 0
    checkpoints = run_dir / "checkpoints"
    elsewhere = tmp_path / "other-disk" / "checkpoint-000001"
    elsewhere.parent.mkdir()
    shutil.move(checkpoints / "checkpoint-000001", elsewhere)
    (checkpoints / "checkpoint-000001").symlink_to(elsewhere, target_is_directory=True)
    shutil.copytree(checkpoints / "checkpoint-000002", checkpoints / "checkpoint-000002-keep")
    metrics = run_dir / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    edited = next(i for i, line in enumerate(lines) if '"step": 1,' in line and '"reward"' in line)
    lines[edited] = lines[edited].replace('"step": 1,', '"step": "1",')
    metrics.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(["train", "--output-dir", str(run_dir), *FAST, "--run.max_steps", "4", "--run.save_steps", "1",
                 "--run.save_total_limit", "2", "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"{checkpoints / 'checkpoint-000001'} was a link to {elsewhere}; rotation" in err
    assert elsewhere.is_dir() and not (checkpoints / "checkpoint-000001").exists()  # the user's copy is theirs
    assert (checkpoints / "checkpoint-000002-keep").is_dir()  # never resumed from, never rotated away
    assert sorted(p.name for p in checkpoints.iterdir()) == ["checkpoint-000002-keep", "checkpoint-000003",
                                                              "checkpoint-000004"]
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if '"reward"' in line]
    assert steps == [1, 2, 3, 4]  # the checkpoint's copy of step 1 stands in for the edited line
    assert '"step": "1"' in (run_dir / "metrics.jsonl.replaced-at-step-000002").read_text()  # nothing lost


def test_a_data_file_regenerated_before_resume_is_refused_naming_it_and_the_way_out(tmp_path, capsys):
    run_dir, data = tmp_path / "run", tmp_path / "train.jsonl"
    common = ["train", "--output-dir", str(run_dir), *ON_DATA, "--data", _data(data, 12), "--run.save_steps", "1"]
    assert main([*common, "--run.max_steps", "1"]) == 0
    capsys.readouterr()  # the first run's own output
    _data(data, 12, offset=1)  # the same path and size, other rows
    line = _fails_in_one_line(capsys, [*common, "--run.max_steps", "2", "--resume"],
                              f"the training data {str(data)!r} changed since that checkpoint was saved")
    assert "12 rows then, 12 now" in line and "another --output-dir" in line
    _data(data, 12)  # restored: the resume goes on
    assert main([*common, "--run.max_steps", "2", "--resume"]) == 0


def test_reward_code_edited_before_resume_is_said_naming_its_file(tmp_path, capsys, monkeypatch):
    """The rewards after the resume are not those of the run's start: the resume goes on (fixing a reward is
    ordinary), with one warning naming the module's file; unchanged code says nothing."""
    module = tmp_path / "edited_reward_for_resume.py"
    module.write_text("def score(completions, **kwargs):\n    return [float(len(c) % 2) for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run_dir = tmp_path / "run"
    common = ["train", "--output-dir", str(run_dir), *SMALL, "--rewards.functions",
              "[edited_reward_for_resume:score]", "--run.save_steps", "1"]
    assert main([*common, "--run.max_steps", "1"]) == 0
    capsys.readouterr()
    assert main([*common, "--run.max_steps", "2", "--resume"]) == 0
    assert "reward functions' code" not in capsys.readouterr().err
    module.write_text("def score(completions, **kwargs):\n    return [1.0 for c in completions]\n")
    assert main([*common, "--run.max_steps", "3", "--resume"]) == 0
    err = capsys.readouterr().err
    assert "the reward functions' code (edited_reward_for_resume.py) changed since" in err
    assert "rewards after the resume are not comparable" in err


def test_a_failed_start_leaves_nothing_in_the_corrected_commands_way(tmp_path, capsys, monkeypatch):
    run_dir, empty_model = tmp_path / "run", tmp_path / "empty-model"
    empty_model.mkdir()
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    no_warm_start = [a for i, a in enumerate(FAST) if "warm_start" not in a and "warm_start" not in FAST[i - 1]]
    assert main(["train", "--output-dir", str(run_dir), *no_warm_start, "--model", str(empty_model)]) == 1
    assert sorted(p.name for p in run_dir.iterdir()) == [".grpo-engine.lock", "notes.txt"]
    capsys.readouterr()
    # the demo fails in its first scoring (a reward that raises), after its base model was written
    (tmp_path / "raising_reward.py").write_text("def score(prompts, completions, **kw):\n    raise ValueError('x')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["train", "--output-dir", str(run_dir), *FAST, "--run.max_steps", "1",
                 "--rewards.functions", "[raising_reward:score]"]) == 1
    assert sorted(p.name for p in run_dir.iterdir()) == [".grpo-engine.lock", "notes.txt"]
    assert main(["train", "--output-dir", str(run_dir), *FAST, "--run.max_steps", "1"]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 0 and "eval_accuracy" in rows[0]  # the accuracy before training is kept
    assert (run_dir / MANIFEST).is_file() and (run_dir / "notes.txt").read_text() == "mine"


def test_a_users_file_of_a_run_files_name_is_refused_and_kept(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("# my notes\nrun: {max_steps: 3}\n")
    (run_dir / "samples.jsonl").write_text('{"mine": 1}\n')
    _fails_in_one_line(capsys, ["train", "--output-dir", str(run_dir), *FAST],
                       "already holds config.yaml, samples.jsonl, which this run did not write")
    assert (run_dir / "config.yaml").read_text().startswith("# my notes")
    assert (run_dir / "samples.jsonl").read_text() == '{"mine": 1}\n'


@pytest.mark.parametrize("edit", ["config.yaml", "base_model/config.json"])
def test_an_engine_file_edited_after_a_failed_start_is_the_users(edit, tmp_path, capsys):
    """The manifest's fingerprints tell the engine's own leftovers from files a person has since changed."""
    from grpo_engine.state.run_files import is_own, record_own

    run_dir = tmp_path / "run"
    (run_dir / "base_model").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("run: {}\n")
    (run_dir / "base_model" / "config.json").write_text("{}")
    record_own(run_dir, "config.yaml")
    record_own(run_dir, "base_model")
    assert is_own(run_dir, "config.yaml") and is_own(run_dir, "base_model")
    (run_dir / edit).write_text((run_dir / edit).read_text() + " ")
    assert not is_own(run_dir, edit.split("/")[0])
