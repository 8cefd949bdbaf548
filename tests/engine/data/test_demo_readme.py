"""The README's example run is reproducible with the command it shows: `grpo-engine train` (the demo's preset seed)
is one of the rows of the README's 5-seed table, whose seeds are the ones `demo_seeds` runs by default, each row
made by the command the README names."""

from __future__ import annotations

import re

from grpo_engine.config import load_config
from grpo_engine.data.demo_task import DEMO_PRESET
from grpo_engine.tools.demo_seeds import run_seed
from repo_paths import ROOT


def _table_seeds(readme: str) -> list[int]:
    header = readme.index("| seed | sampled acc. start -> end |")
    rows = readme[header:].split("\n\n")[0].splitlines()[2:]
    return [int(re.match(r"\|\s*(\d+)\s*\|", row).group(1)) for row in rows]


def test_the_readme_example_run_is_a_row_of_its_table():
    readme = (ROOT / "README.md").read_text()
    seeds = _table_seeds(readme)
    demo_seed = load_config(preset=DEMO_PRESET).run.seed  # what `grpo-engine train` with no arguments uses
    assert demo_seed in seeds
    assert f"`grpo-engine train` alone is seed {demo_seed}" in " ".join(readme.split())
    source = (ROOT / "grpo_engine" / "tools" / "demo_seeds.py").read_text()
    default = [int(s) for s in re.search(r'"--seeds".*default=\[([\d, ]+)\]', source).group(1).split(",")]
    assert sorted(default) == sorted(seeds)  # `python -m grpo_engine.tools.demo_seeds` makes exactly the table's rows


def test_each_table_row_is_made_by_the_command_the_readme_names(tmp_path, monkeypatch):
    """demo_seeds runs `grpo-engine train --run.seed S --output-dir DIR` (the README's command, without the bar)."""
    commands = []

    def record(command, log):
        commands.append(command)
        raise SystemExit

    monkeypatch.setattr("grpo_engine.tools.demo_seeds.timed_run", record)
    try:
        run_seed(3, tmp_path, [])
    except SystemExit:
        pass
    assert commands[0][1:] == ["-m", "grpo_engine", "train", "--run.seed", "3", "--output-dir", str(tmp_path / "seed-3"),
                               "--run.progress_bar", "false"]  # display only: changes nothing the run computes
