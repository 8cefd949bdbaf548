"""A reward function that does to the run directory what a person or a cleanup job can while a run trains: deletes,
renames or replaces it (what, and where, from the environment the test sets). Loaded as `moving_rewards:NAME`."""

import os
import shutil
from pathlib import Path


CALLS = {}  # run directory -> calls so far (the engine puts the environment back after each call)


def moves_the_run_directory(prompts, completions, **kwargs):
    """Acts on its MOVED_AT_CALL-th call: the first scores the evaluation before training, the next ones the steps."""
    run_dir, action = Path(os.environ["MOVED_RUN_DIR"]), os.environ["MOVED_RUN_DIR_ACTION"]
    CALLS[run_dir] = CALLS.get(run_dir, 0) + 1
    if CALLS[run_dir] == int(os.environ["MOVED_AT_CALL"]):
        if action == "delete":
            shutil.rmtree(run_dir)
        elif action == "rename":
            run_dir.rename(run_dir.with_name(run_dir.name + "-moved"))
        elif action == "replace with an empty directory":
            run_dir.rename(run_dir.with_name(run_dir.name + "-moved"))
            run_dir.mkdir()
        elif action == "replace with a copy":
            shutil.copytree(run_dir, run_dir.with_name(run_dir.name + "-copy"), symlinks=True)
            run_dir.rename(run_dir.with_name(run_dir.name + "-moved"))
            run_dir.with_name(run_dir.name + "-copy").rename(run_dir)
    return [0.0] * len(completions)
