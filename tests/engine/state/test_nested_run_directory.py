"""A run directory inside another run's checkpoints/ or base_model/ is refused before any work: it was accepted,
and the new run wrote its config.yaml, logs, base_model/ and checkpoints/ among the other run's checkpoints (or
into its saved starting model)."""

from __future__ import annotations

import pytest

from grpo_engine.cli import main
from grpo_engine.state.run_files import MANIFEST
from grpo_engine.state.run_lock import LOCK_FILE, RunDirectoryError, check_output_dir


def _saved_run(root, marker: str):
    run = root / "run"
    (run / "checkpoints" / "checkpoint-000002").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint-000002" / "trainer_state.json").write_text("{}")
    (run / "base_model").mkdir()
    (run / "base_model" / "config.json").write_text("{}")
    (run / marker).write_text("")
    return run


def _tree(root) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() if p.is_file() else "" for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("marker", [LOCK_FILE, MANIFEST])
@pytest.mark.parametrize("inside", ["checkpoints", "checkpoints/checkpoint-000002", "checkpoints/new/deeper",
                                    "base_model", "base_model/sub"])
def test_a_run_directory_inside_another_runs_own_directories_is_refused_and_nothing_written(marker, inside, tmp_path,
                                                                                            capsys):
    run = _saved_run(tmp_path, marker)
    before = _tree(tmp_path)
    with pytest.raises(RunDirectoryError, match=f"the {inside.split('/')[0]}/ of the run directory"):
        check_output_dir(run / inside)
    assert main(["train", "--output-dir", str(run / inside), "--run.max_steps", "1"]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--output-dir" in err and "which that run writes itself" in err, err
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("place", ["run/other", "run", "elsewhere/checkpoints", "run/other/checkpoints"])
def test_a_directory_beside_or_above_those_is_accepted(place, tmp_path):
    # Only the entries the engine keeps in a run directory are another run's; a directory named checkpoints that
    # is not in a run directory is anyone's.
    _saved_run(tmp_path, LOCK_FILE)
    check_output_dir(tmp_path / place)
