"""Resume that a user can trust: damaged checkpoints are named and skipped, options cannot silently change,
a new run does not write over an earlier one's logs."""

import json
import math
import re
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from grpo_engine.config import load_config
from grpo_engine.state import checkpoint as ckpt
from grpo_engine.trainer import train


@pytest.fixture()
def saved_run(small_overrides) -> tuple[dict, Path]:
    """A 3-step run with a checkpoint after every step."""
    overrides = {**small_overrides, "run.save_steps": 1, "run.save_total_limit": 3}
    train(load_config(overrides=overrides))
    return overrides, Path(overrides["run.output_dir"])


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_byte(path: Path) -> None:  # same size, still loads: only the checksum can tell
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.slow
@pytest.mark.parametrize("damage, name, problem", [
    (_truncate, "optimizer.pt", "optimizer.pt is truncated"),
    (_truncate, "model/model.safetensors", "model/model.safetensors is truncated"),
    (_truncate, "rng-0.pt", "rng-0.pt is truncated"),
    (_flip_a_byte, "model/model.safetensors", "model/model.safetensors is corrupted"),
    (lambda path: path.write_text("{not json"), ckpt.STATE_FILE, f"{ckpt.STATE_FILE} is unreadable"),
])
def test_a_damaged_checkpoint_is_named_and_latest_falls_back(saved_run, damage, name, problem):
    _, run_dir = saved_run
    newest = ckpt.list_checkpoints(run_dir)[-1]
    damage(newest / name)
    assert any(problem in p for p in ckpt.checkpoint_problems(newest))
    point = ckpt.resolve_resume("latest", run_dir)
    assert point.path.name == "checkpoint-000002" and point.step == 2
    assert point.skipped and "checkpoint-000003 is damaged" in point.skipped[0] and problem in point.skipped[0]
    with pytest.raises(ckpt.CheckpointError, match=f"checkpoint-000003 is damaged: .*{problem}"):
        ckpt.resolve_resume(str(newest), run_dir)  # a checkpoint named explicitly is not replaced


@pytest.mark.slow
@pytest.mark.parametrize("value, kind", [(math.nan, "NaN"), (math.inf, "inf")])
def test_non_finite_weights_are_refused_and_latest_falls_back(saved_run, value, kind):
    _, run_dir = saved_run
    newest = ckpt.list_checkpoints(run_dir)[-1]
    weights = newest / "model" / "model.safetensors"
    tensors = load_file(weights)
    name = sorted(tensors)[-1]
    tensors[name].view(-1)[:2] = value  # as a diverged run saves them
    save_file(tensors, weights, metadata={"format": "pt"})
    ckpt.write_manifest(newest)  # every checksum consistent: only the values are wrong
    problem = f"model/model.safetensors: tensor {name!r} holds {kind} (2 of {tensors[name].numel()} values)"
    assert ckpt.checkpoint_problems(newest) == [problem]
    point = ckpt.resolve_resume("latest", run_dir)
    assert point.path.name == "checkpoint-000002" and problem in point.skipped[0]
    with pytest.raises(ckpt.CheckpointError, match=re.escape(problem)):
        ckpt.resolve_resume(str(newest), run_dir)


@pytest.mark.slow
def test_resume_skips_the_damaged_one_and_says_so(saved_run, capsys):
    overrides, run_dir = saved_run
    _truncate(ckpt.list_checkpoints(run_dir)[-1] / "optimizer.pt")
    capsys.readouterr()
    train(load_config(overrides={**overrides, "run.resume": "latest", "run.max_steps": 4, "run.progress_bar": True}))
    captured = capsys.readouterr()
    assert "warning: checkpoint-000003 is damaged: optimizer.pt is truncated" in captured.err
    assert "falling back to an older checkpoint" in captured.err
    assert f"resuming from {run_dir / 'checkpoints' / 'checkpoint-000002'} at step 2 of 4" in captured.out
    assert " 2/4 [" in captured.err and " 4/4 [" in captured.err  # the bar starts at the true position
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == [1, 2, 3, 4]


@pytest.mark.slow
def test_no_intact_checkpoint_is_a_clear_error(saved_run):
    _, run_dir = saved_run
    for path in ckpt.list_checkpoints(run_dir):
        (path / ckpt.MANIFEST_FILE).unlink()
    with pytest.raises(ckpt.CheckpointError, match="no intact checkpoint in .*checkpoint-000003 is damaged: "
                                                   "checksums.json is missing.*checkpoint-000001 is damaged"):
        ckpt.resolve_resume("latest", run_dir)


@pytest.mark.slow
def test_an_unreadable_file_is_named_when_loading(saved_run):
    _, run_dir = saved_run
    newest = ckpt.list_checkpoints(run_dir)[-1]
    _truncate(newest / "scheduler.pt")
    with pytest.raises(ckpt.CheckpointError, match="cannot read .*scheduler.pt"):
        ckpt.load_training_state(newest, 0)


@pytest.mark.slow
def test_resume_refuses_changed_options_and_keeps_the_saved_config(saved_run):
    overrides, run_dir = saved_run
    before = (run_dir / "config.yaml").read_text()
    changed = {**overrides, "run.resume": "latest", "run.max_steps": 5, "optim.learning_rate": 0.02,
               "loss.beta": 0.1}
    with pytest.raises(ckpt.CheckpointError, match=r"different options: loss.beta \(saved 0.0, now 0.1\), "
                                                   r"optim.learning_rate \(saved 0.01, now 0.02\)\. .*give the "
                                                   r"saved values \(--loss.beta 0.0 --optim.learning_rate 0.01\)"):
        train(load_config(overrides=changed))
    assert (run_dir / "config.yaml").read_text() == before
    with pytest.raises(ckpt.CheckpointError, match="at step 3; run.max_steps \\(3\\) leaves nothing to do"):
        train(load_config(overrides={**overrides, "run.resume": "latest"}))
    assert (run_dir / "config.yaml").read_text() == before


@pytest.mark.slow
def test_a_new_run_refuses_an_earlier_runs_metrics(small_overrides):
    run_dir = Path(small_overrides["run.output_dir"])
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
    with pytest.raises(ckpt.CheckpointError, match="already holds an earlier run's metrics.jsonl: pass --resume"):
        train(load_config(overrides=small_overrides))
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 1, "reward": 0.5}\n'


@pytest.mark.slow
@pytest.mark.parametrize("saved, now", [
    ({"rewards.functions": ["math_accuracy", "length"], "data.system_prompt": "Be brief. #1 rule",
      "optim.learning_rate": 1.5e-5}, {}),
    ({"model.lora.enabled": True, "rollout.top_k": 7}, {"data.system_prompt": "It's 'quoted'"}),
])
def test_the_refusal_names_the_flags_that_resume_with_the_saved_options(saved, now, small_overrides):
    # the message's flags, typed as a user would, give back exactly the saved options
    import shlex

    from grpo_engine.cli import join_flag_values, _overrides, build_parser
    from grpo_engine.config import config_yaml
    from grpo_engine.state.resume import _saved_flags, changed_options

    saved_config = load_config(overrides={**small_overrides, **saved})
    resumed = load_config(overrides={**small_overrides, **now, "run.resume": "latest"})
    changed = changed_options(config_yaml(saved_config), resumed)
    assert changed
    flags = shlex.split(_saved_flags(changed))
    args = build_parser().parse_args(join_flag_values(["train", *flags]))
    given = load_config(overrides={**small_overrides, **now, "run.resume": "latest",
                                   **_overrides(args, {"max_steps": "run.max_steps"})})
    assert changed_options(config_yaml(saved_config), given) == {}


@pytest.mark.slow
def test_a_fresh_run_writes_over_nothing_it_did_not_write(small_overrides, tmp_path):
    from grpo_engine.config import config_yaml
    from grpo_engine.state.resume import start_point

    run_dir = tmp_path / "project"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("# my settings, with comments\nrun:\n  max_steps: 3\n")
    (run_dir / "samples.jsonl").write_text("my notes\n")
    config = load_config(overrides={**small_overrides, "run.output_dir": str(run_dir)})
    with pytest.raises(ckpt.CheckpointError, match=r"already holds config.yaml, samples.jsonl, which this run did "
                                                   r"not write and would replace"):
        start_point(config, run_dir, announce=False)
    with pytest.raises(ckpt.CheckpointError, match="already holds config.yaml"):
        train(config)
    assert (run_dir / "config.yaml").read_text().startswith("# my settings")  # untouched
    assert (run_dir / "samples.jsonl").read_text() == "my notes\n"

    # its own earlier start (stopped before step 1: the same config.yaml and a built-in model) starts again
    (run_dir / "samples.jsonl").unlink()
    (run_dir / "config.yaml").write_text(config_yaml(config))
    (run_dir / "base_model").mkdir()
    (run_dir / "base_model" / "config.json").write_text("{}")
    assert start_point(config, run_dir, announce=False) is None


@pytest.mark.slow
def test_a_checkpoint_saved_before_a_setting_existed_resumes_as_it_ran(small_overrides):
    # A checkpoint of an engine without optim.master_weights: its config.yaml lacks the key (its manifest written
    # over that file), its optimizer is torch's AdamW. The resume says which value the run trained as, and goes on
    # with it.
    import yaml

    from grpo_engine.state.saved_settings import ADDED_SETTINGS

    earlier = ADDED_SETTINGS["optim.master_weights"]
    overrides = {**small_overrides, "run.max_steps": 2, "run.save_steps": 2, "optim.master_weights": earlier}
    train(load_config(overrides=overrides))
    run_dir = Path(overrides["run.output_dir"])
    (saved,) = ckpt.list_checkpoints(run_dir)
    tree = yaml.safe_load((saved / ckpt.CONFIG_FILE).read_text())
    del tree["optim"]["master_weights"]
    (saved / ckpt.CONFIG_FILE).write_text(yaml.safe_dump(tree, sort_keys=False))
    ckpt.write_manifest(saved)
    assert not ckpt.checkpoint_problems(saved)

    resumed = {**overrides, "run.max_steps": 3, "run.resume": "latest"}
    del resumed["optim.master_weights"]  # the default now
    with pytest.raises(ckpt.CheckpointError, match=re.escape(f"optim.master_weights (saved {earlier!r}, now 'auto')")
                       + ".*" + re.escape(f"--optim.master_weights {earlier}")):
        train(load_config(overrides=resumed))
    train(load_config(overrides={**resumed, "optim.master_weights": earlier}))
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == [1, 2, 3]
