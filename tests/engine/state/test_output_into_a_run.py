"""`eval --output` / `plot --output` naming a run directory's own file (its metrics.jsonl, config.yaml, lock, ...) or
a path in its checkpoints/ or base_model/, the run training or finished: one line naming it, before any work, the
run's file untouched. Before, `eval --output RUN/metrics.jsonl` replaced a run's log with the evaluation's JSON."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import main
from grpo_engine.state.run_lock import (LOCK_FILE, RUN_DIRECTORY_DIRS, RUN_DIRECTORY_FILES, RunDirectoryError,
                                        check_output_file)
from grpo_engine.state.plot import PLOT_FILE


def _run_directory(root: Path) -> Path:
    run = root / "run"
    run.mkdir()
    (run / LOCK_FILE).write_text("")
    for name in RUN_DIRECTORY_FILES:
        if name != LOCK_FILE and not name.startswith("."):
            (run / name).write_text(f"the run's {name}\n")
    for name in RUN_DIRECTORY_DIRS:
        (run / name).mkdir()
    return run


TAILS = st.lists(st.sampled_from(["checkpoint-000002", "model", "x.json", "sub"]), max_size=3)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(RUN_DIRECTORY_FILES + RUN_DIRECTORY_DIRS), tail=TAILS,
       may_replace=st.sampled_from([(), (PLOT_FILE,)]), through_link=st.booleans())
def test_a_runs_own_files_are_refused_as_an_output(name, tail, may_replace, through_link, tmp_path_factory):
    root = tmp_path_factory.mktemp("o")
    run = _run_directory(root)
    if through_link:
        (root / "link").symlink_to(run)
    inside_dir = name in RUN_DIRECTORY_DIRS
    output = (root / ("link" if through_link else "run") / name).joinpath(*(tail or ["out.json"] if inside_dir else []))
    refused = inside_dir or name not in may_replace
    before = {p: p.read_text() for p in run.rglob("*") if p.is_file()}
    if refused:
        with pytest.raises(RunDirectoryError) as raised:
            check_output_file(output, "--output", may_replace)
        message = str(raised.value)
        assert "\n" not in message and "--output" in message and name in message and str(run) in message
    else:
        check_output_file(output, "--output", may_replace)
    assert {p: p.read_text() for p in run.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("name", ["metrics.jsonl", "notes.json", "run"])
def test_files_beside_a_run_or_of_other_names_are_accepted(name, tmp_path):
    run = _run_directory(tmp_path)
    check_output_file(run / "eval-results.json")
    check_output_file(tmp_path / f"{name}.out")
    plain = tmp_path / "plain"
    plain.mkdir()
    check_output_file(plain / name)  # a directory no run has used: its names are the user's


@pytest.mark.parametrize("command", [["eval", "--model", "org/model"], ["plot", "RUN"]])
def test_the_cli_refuses_before_any_work(command, tmp_path, capsys):
    run = _run_directory(tmp_path)
    target = run / ("metrics.jsonl" if command[0] == "eval" else "checkpoints/c.png")
    argv = [str(run) if a == "RUN" else a for a in command] + ["--output", str(target)]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "RunDirectoryError" in err[0] and str(run) in err[0]
    assert (run / "metrics.jsonl").read_text() == "the run's metrics.jsonl\n"
