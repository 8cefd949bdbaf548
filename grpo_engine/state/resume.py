"""How a run starts: fresh, into a directory no earlier run has written to, or resumed from an intact
checkpoint with the options it was saved with (except the few that may change between sessions)."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import Any, Optional

import yaml

from ..config import SHARED_SETTINGS, EngineConfig, config_yaml, parse_yaml
from ..config.strict_yaml import MAX_CONFIG_BYTES, StrictDumper
from . import checkpoint as ckpt
from .bounded_read import read_bounded_bytes, read_json_file
from .run_files import is_own
from .saved_settings import added_settings_missing, check_saved_settings
from .finished_run import RunFinished, finished_step, report
from .metrics import METRICS_FILE, SAMPLES_FILE

_log = logging.getLogger(__name__)  # grpo_engine/messages.py: how the CLI shows it

# Options that do not change what the resumed steps compute: how long to go on, what to save, log and show.
MAY_CHANGE_ON_RESUME = (
    "run.max_steps", "run.resume", "run.output_dir", "run.save_steps", "run.save_total_limit",
    "run.save_on_interrupt", "run.log_completions_steps", "run.eval_steps", "run.eval_num_samples",
    "run.report_to", "run.progress_bar", "run.plot", "run.num_threads", "run.distributed_timeout_s",
    "data.max_prompt_chars",  # only refuses data; checkpoints from before it existed resume too
)


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def changed_options(saved_yaml: str, config: EngineConfig,
                    source: str = "the saved config.yaml") -> dict[str, tuple[Any, Any]]:
    """{key: (saved, now)} for the options that differ and may not change on resume."""
    tree = parse_yaml(saved_yaml, source)
    if not isinstance(tree, dict) or not all(isinstance(v, dict) for v in tree.values()):
        # What the engine saves is a mapping of sections: anything else was edited (or is another program's file).
        raise ckpt.CheckpointError(f"{source} is not a config the engine saves (a mapping of sections of settings); "
                                   f"resume from another checkpoint")
    check_saved_settings(tree, source, MAY_CHANGE_ON_RESUME)
    # A config saved before the loss took its shared settings from the rollout names them twice.
    saved = {key: value for key, value in _flatten(tree).items() if key not in SHARED_SETTINGS}
    saved.update(added_settings_missing(tree))  # what the run trained as, in a config saved before the setting
    now = _flatten(parse_yaml(config_yaml(config), "config.yaml"))  # through YAML too: both sides have its types
    return {key: (saved.get(key), now.get(key)) for key in sorted(saved.keys() | now.keys())
            if saved.get(key) != now.get(key) and key not in MAY_CHANGE_ON_RESUME}


def check_fresh_directory(run_dir: Path) -> None:
    """A new run would mix its checkpoints or metrics with an earlier run's."""
    metrics = run_dir / METRICS_FILE
    if ckpt.list_checkpoints(run_dir):
        found = "checkpoints"
    elif metrics.is_file() and metrics.stat().st_size > 0:
        found = f"an earlier run's {METRICS_FILE}"
    else:
        return
    raise ckpt.CheckpointError(f"{run_dir} already holds {found}: pass --resume to continue that run, or choose "
                               f"another --output-dir (or delete the directory)")


# What a run writes into its directory besides its metrics and checkpoints (checked above): a fresh run writes over
# none of them unless its own earlier start left them (a run stopped before its first step: the same config.yaml).
RUN_FILES = ("config.yaml", SAMPLES_FILE, "curves.png", "base_model")


def check_nothing_to_overwrite(config: EngineConfig, run_dir: Path) -> None:
    """A fresh run in a directory that already holds files of a run's names it did not write refuses to start:
    the user's own config.yaml (comments and all), notes or model there would be replaced."""
    config_file = run_dir / "config.yaml"
    own_start = config_file.is_file() and read_bounded_bytes(
        config_file, MAX_CONFIG_BYTES, "a run's config.yaml").decode(errors="replace") == config_yaml(config)
    foreign = []
    for name in RUN_FILES:
        path = run_dir / name
        if not path.exists() or (path.is_dir() and not any(path.iterdir())) or (path.is_file() and
                                                                                 not path.stat().st_size):
            continue
        if not own_start and not is_own(run_dir, name):
            foreign.append(name + "/" * path.is_dir())
    if foreign:
        raise ckpt.CheckpointError(f"{run_dir} already holds {', '.join(foreign)}, which this run did not write and "
                                   f"would replace: choose another --output-dir, or move them")


def _listing(changed: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{key} (saved {saved!r}, now {now!r})" for key, (saved, now) in changed.items())


def _saved_flags(changed: dict[str, tuple[Any, Any]]) -> str:
    """The flags that give back the saved values (as a user types them: text as written, the rest as YAML)."""
    def text(value: Any) -> str:
        if value is None:
            return "null"
        if isinstance(value, str):
            return shlex.quote(value)
        flow = yaml.dump(value, Dumper=StrictDumper, default_flow_style=True, width=float("inf"))
        return shlex.quote(flow.removesuffix("\n...\n").strip())

    return " ".join(f"--{key} {text(saved)}" for key, (saved, _) in changed.items())


def check_finished_run(config: EngineConfig, run_dir: Path) -> None:
    """A fresh start in a directory whose run has finished: RunFinished (its report) when this is that run again,
    else what to do instead."""
    found = finished_step(run_dir)
    if found is None:
        return
    point, saved = found
    changed = changed_options(ckpt.saved_config(point.path), config, str(point.path / ckpt.CONFIG_FILE))
    if changed:
        raise ckpt.CheckpointError(f"{run_dir} holds a finished run with other options: {_listing(changed)}; "
                                   f"choose another --output-dir for a new run (or delete the directory)")
    if config.run.max_steps > point.step:
        raise ckpt.CheckpointError(f"{run_dir} holds this run, finished at step {point.step}: add --resume to train "
                                   f"it on to step {config.run.max_steps}, or choose another --output-dir for a "
                                   f"fresh run")
    raise RunFinished(report(run_dir, point, saved))


def _same_place(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:  # one of them does not exist
        return False


def check_resumes_its_own(point: ckpt.ResumePoint, run_dir: Path) -> None:
    """`--resume DIR` naming another run directory's checkpoint starts this directory's run from it (a fork) only
    when this directory holds no run of its own: else the resumed steps' checkpoints and logs would be written over
    that run's (its later checkpoints re-saved from the other run's weights, its metrics.jsonl merged with the other
    run's history: steps [1, 1, 2, ...]). A checkpoint in this run's checkpoints/ (a copy under another name too) or
    linked from there is its own."""
    root = ckpt.checkpoint_root(run_dir)
    own = ckpt.list_checkpoints(run_dir)
    if _same_place(point.path.parent, root) or any(_same_place(point.path, path) for path in own):
        return
    metrics = run_dir / METRICS_FILE
    held = [f"checkpoints up to step {ckpt.checkpoint_step(own[-1])}"] if own else []
    held += [METRICS_FILE] if metrics.is_file() and metrics.stat().st_size > 0 else []
    if held:
        raise ckpt.CheckpointError(
            f"cannot resume {point.path} in {run_dir}: it is another run directory's checkpoint, and {run_dir} holds a "
            f"run of its own ({' and '.join(held)}), whose checkpoints and logs the resumed steps would replace; "
            f"resume it into an empty --output-dir (a new run goes on from it there), or resume {run_dir}'s own run "
            f"with --resume alone")


def check_same_data(point: ckpt.ResumePoint, data: dict[str, dict[str, Any]], announce: bool) -> None:
    """The data a run resumes on is the data its checkpoint was saved with (by the fingerprints of its rows): the
    saved position in the data means nothing over other rows. Changed evaluation rows or reward code only make
    evaluations or rewards incomparable: a warning. Checkpoints saved before fingerprints were kept are not checked."""
    saved = read_json_file(point.path / ckpt.STATE_FILE, "a checkpoint's trainer state").get("data")
    if not isinstance(saved, dict):
        return
    for role, now in data.items():
        then = saved.get(role)
        if not isinstance(then, dict) or then.get("sha256") == now["sha256"]:
            continue
        source = now["source"]
        counts = f"{then.get('rows', '?')} rows then, {now['rows']} now"
        if role == "train":
            raise ckpt.CheckpointError(
                f"cannot resume {point.path}: the training data {source} changed since that checkpoint was saved "
                f"({counts}; its fingerprint differs), and the run would go on from the saved position over other "
                f"rows. Restore the data it was saved with, or train on the new data in a new run (another "
                f"--output-dir)")
        if announce and role == "rewards":
            _log.warning(f"warning: the reward functions' code ({source}) changed since {point.path} was saved: "
                         f"rewards after the resume are not comparable with the earlier ones")
        elif announce:
            _log.warning(f"warning: the evaluation data {source} changed since {point.path} was saved ({counts}): "
                         f"evaluations after the resume are not comparable with the earlier ones")


def start_point(config: EngineConfig, run_dir: Path, announce: bool,
                data: Optional[dict[str, dict[str, Any]]] = None, processes: int = 1) -> Optional[ckpt.ResumePoint]:
    """None for a fresh run; else the checkpoint to resume from, after checking its config against this one, its
    data's fingerprints against `data` ({"train" / "eval": data_fingerprint(...)}) and the data-parallel processes
    that saved it against `processes`."""
    if not config.run.resume:
        check_finished_run(config, run_dir)
        check_fresh_directory(run_dir)
        check_nothing_to_overwrite(config, run_dir)
        return None
    point = ckpt.resolve_resume(config.run.resume, run_dir)
    check_resumes_its_own(point, run_dir)
    if announce:
        for note in point.skipped:
            _log.warning(f"warning: {note}; falling back to an older checkpoint")
    changed = changed_options(ckpt.saved_config(point.path), config, str(point.path / ckpt.CONFIG_FILE))
    if changed:
        raise ckpt.CheckpointError(
            f"cannot resume {point.path} with different options: {_listing(changed)}. A resumed run keeps the options it "
            f"was started with, except {', '.join(MAY_CHANGE_ON_RESUME)}: to resume it, give the saved values "
            f"({_saved_flags(changed)}); to train with new options, start a new run in another --output-dir")
    check_same_data(point, data or {}, announce)
    ckpt.check_saved_processes(point.path, processes)
    if point.step >= config.run.max_steps:
        raise ckpt.CheckpointError(f"{point.path} is at step {point.step}; run.max_steps ({config.run.max_steps}) "
                                   f"leaves nothing to do (raise --run.max_steps to train on)")
    if announce:
        _log.info(f"resuming from {point.path} at step {point.step} of {config.run.max_steps}")
    return point
