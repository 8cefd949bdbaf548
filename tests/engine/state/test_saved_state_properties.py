"""A checkpoint's torch files (optimizer, scheduler, RNG state) edited, swapped from another run or written by another
program: read with weights_only, so a file asking for any object beyond tensors and plain values runs no code and is
one line naming it; a state of another shape is one line naming its file before any model loads (hypothesis). The
oracle is the run itself: a state the check accepts applies to the run's objects and takes an optimizer step (before,
AdamW took moments of another shape and failed at the next step, deep in torch)."""

from __future__ import annotations

import copy
import pickle
import random
from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.state import checkpoint as ckpt
from grpo_engine.state.saved_state import load_plain
from saved_states import (optimizer_and_scheduler, small_model, trained_states, train_step, write_sharded_state,
                          write_states)

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _applies(states: dict) -> bool:
    """Whether the run's objects take `states` and go on training (the run's own RNG state restored after)."""
    model = small_model()
    optimizer, scheduler = optimizer_and_scheduler(model)
    kept = ckpt.rng_state()
    try:
        optimizer.load_state_dict(states["optimizer"])
        scheduler.load_state_dict(states["scheduler"])
        ckpt.set_rng_state(states["rng"])
        train_step(model, optimizer, scheduler)
        return all(torch.isfinite(p).all() for p in model.parameters())
    except Exception:
        return False
    finally:
        ckpt.set_rng_state(kept)


ODD = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6), st.floats(), st.text(max_size=3),
                st.lists(st.integers(0, 3), max_size=3), st.just(torch.zeros(2, 5)), st.just(torch.zeros(3)),
                st.just(torch.zeros(0, dtype=torch.uint8)), st.dictionaries(st.text(max_size=2), st.integers(),
                                                                             max_size=2))
# Where an edit lands: a file's key path; "*" is the first per-parameter state.
PLACES = [("optimizer",), ("optimizer", "state"), ("optimizer", "param_groups"), ("optimizer", "state", "*"),
          ("optimizer", "state", "*", "exp_avg"), ("optimizer", "state", "*", "exp_avg_sq"),
          ("optimizer", "param_groups", 0, "params"), ("scheduler",), ("scheduler", "last_epoch"),
          ("scheduler", "base_lrs"), ("scheduler", "lr_lambdas"), ("rng",), ("rng", "python"), ("rng", "numpy"),
          ("rng", "torch"), ("rng", "cuda")]


def _edit(states: dict, place: tuple, how: str, value) -> None:
    parent = states
    for key in place[:-1]:
        parent = parent[next(iter(parent))] if key == "*" else parent[key]
    key = next(iter(parent)) if place[-1] == "*" else place[-1]
    if len(place) == 1:  # the whole file's content
        parent[key] = value
    elif how == "delete" and isinstance(parent, dict):
        parent.pop(key, None)
    elif how == "extra" and isinstance(parent, dict):
        parent["added_by_hand"] = value
    else:
        parent[key] = value


def _one_line_naming(message: str, name: str) -> bool:
    return "\n" not in message and name in message and len(message) < 400


@SETTINGS
@given(place=st.sampled_from(PLACES), how=st.sampled_from(["set", "delete", "extra"]), value=ODD)
def test_an_edited_state_applies_or_is_one_line_naming_its_file_before_the_model_loads(place, how, value, tmp_path):
    states = copy.deepcopy(trained_states())
    _edit(states, place, how, value)
    write_states(tmp_path, states)
    file = {"optimizer": "optimizer.pt", "scheduler": "scheduler.pt", "rng": "rng-0.pt"}[place[0]]
    try:
        loaded = ckpt.load_training_state(tmp_path, 0, check_against_model=True)
    except ckpt.CheckpointError as exc:
        assert _one_line_naming(str(exc), file), str(exc)
        return
    assert _applies(loaded), (place, how, value)


@SETTINGS
@given(shapes=st.lists(st.lists(st.integers(1, 8), min_size=1, max_size=2).map(tuple), min_size=1, max_size=6))
def test_the_optimizer_of_another_model_is_refused_before_the_model_loads(shapes, tmp_path):
    other = [torch.zeros(shape, requires_grad=True) for shape in shapes]
    optimizer = torch.optim.AdamW(other, lr=0.1)
    sum(p.sum() for p in other).backward()
    optimizer.step()
    states = {**trained_states(), "optimizer": optimizer.state_dict()}
    write_states(tmp_path, states)
    try:
        ckpt.load_training_state(tmp_path, 0, check_against_model=True)
    except ckpt.CheckpointError as exc:
        assert _one_line_naming(str(exc), "optimizer.pt"), str(exc)
        assert not _applies(states)
        return
    if _applies(states):
        return
    # Fewer parameters, each of a shape the model has: a model file does not tell a parameter from a saved buffer,
    # so this is left to the restore, which refuses it in one line naming the file (after the model loads).
    model_shapes = Counter(tuple(p.shape) for p in small_model().parameters())
    assert Counter(shapes) < model_shapes, shapes
    optimizer, _ = optimizer_and_scheduler(small_model())
    with pytest.raises(ckpt.CheckpointError) as refused, ckpt.restoring(tmp_path / "optimizer.pt"):
        optimizer.load_state_dict(states["optimizer"])
    assert _one_line_naming(str(refused.value), "optimizer.pt")


class _Anything:  # any object a pickle can name: weights_only refuses to build it
    pass


@pytest.mark.parametrize("payload", [Fraction(1, 3), _Anything(), {"state": {}, "param_groups": [Path("x")]},
                                     np.random.default_rng(0), random.Random(0)])
@pytest.mark.parametrize("file", ["optimizer.pt", "scheduler.pt", "rng-0.pt"])
def test_a_file_asking_for_other_objects_runs_no_code_and_is_one_line_naming_it(payload, file, tmp_path):
    write_states(tmp_path, trained_states())
    torch.save(payload, tmp_path / file)
    with pytest.raises(ckpt.CheckpointError) as refused:
        ckpt.load_training_state(tmp_path, 0)
    assert _one_line_naming(str(refused.value), file) and "other than tensors" in str(refused.value)


def test_a_pickle_that_would_run_code_is_refused_without_running_it(tmp_path):
    ran = tmp_path / "ran"

    class _Runs:
        def __reduce__(self):
            return (Path.touch, (ran,))

    write_states(tmp_path, trained_states())
    (tmp_path / "scheduler.pt").write_bytes(pickle.dumps(_Runs()))  # a legacy-format pickle
    torch.save(_Runs(), tmp_path / "rng-0.pt")
    for file in ("scheduler.pt", "rng-0.pt"):
        with pytest.raises(ckpt.CheckpointError, match=file):
            load_plain(tmp_path / file)
    assert not ran.exists()


def test_the_saved_rng_state_is_plain_and_an_older_one_with_numpy_arrays_still_loads(tmp_path):
    write_states(tmp_path, {**trained_states(), "rng": ckpt.rng_state()})  # numpy's keys an array, as saved before
    state = ckpt.load_training_state(tmp_path, 0, check_against_model=True)
    assert isinstance(state["rng"]["numpy"][1], np.ndarray)
    torch.save(ckpt.plain_rng_state(ckpt.rng_state()), tmp_path / "rng-0.pt")
    plain = torch.load(tmp_path / "rng-0.pt", weights_only=True)  # no global allowed: plain values only
    assert isinstance(plain["numpy"][1], list) and len(plain["numpy"][1]) == 624
    drawn = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    ckpt.set_rng_state(plain)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == drawn  # the same streams again


@pytest.mark.slow
def test_a_resume_with_another_models_optimizer_stops_before_any_weight_loads(small_overrides, monkeypatch):
    from grpo_engine import run_setup
    from grpo_engine.config import load_config
    from grpo_engine.trainer import train

    overrides = {**small_overrides, "run.max_steps": 1, "run.save_steps": 1}
    train(load_config(overrides=overrides))
    point = ckpt.list_checkpoints(overrides["run.output_dir"])[-1]
    model = small_model()
    optimizer, scheduler = optimizer_and_scheduler(model)
    train_step(model, optimizer, scheduler)
    torch.save(optimizer.state_dict(), point / "optimizer.pt")
    (point / ckpt.MANIFEST_FILE).unlink()
    ckpt.write_manifest(point)  # swapped by hand, the manifest rewritten: no checksum catches it

    def loaded(*args, **kwargs):
        raise AssertionError("a model was built or loaded before the saved state was checked")

    monkeypatch.setattr(run_setup, "_builtin_base_model", loaded)
    monkeypatch.setattr(run_setup, "load_causal_lm", loaded)
    with pytest.raises(ckpt.CheckpointError) as refused:
        train(load_config(overrides={**overrides, "run.max_steps": 2, "run.resume": "latest"}))
    assert _one_line_naming(str(refused.value), str(point / "optimizer.pt")), str(refused.value)


# What a pickle can name to run code when loaded; each is built with harmless arguments, in case it ran.
HOSTILE_GLOBALS = [(eval, ("1",)), (exec, ("x = 1",)), (__import__("os").system, ("true",)),
                   (getattr, ("text", "upper")), (torch.load, ("missing.pt",)), (Path.touch, (Path("ran"),)),
                   (__import__("subprocess").getoutput, ("true",)), (__import__("importlib").import_module, ("os",)),
                   (torch.serialization.load, ("missing.pt",)), (__import__("builtins").open, ("ran", "w"))]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hostile=st.sampled_from(HOSTILE_GLOBALS), inside=st.booleans())
def test_a_sharded_checkpoints_metadata_naming_anything_else_is_refused_before_it_loads(hostile, inside, tmp_path,
                                                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a payload that ran would leave "ran"
    write_states(tmp_path, trained_states())
    metadata = write_sharded_state(tmp_path / ckpt.SHARDED_DIR)
    ckpt.load_training_state(tmp_path, 0, sharded_optimizer=True)  # as saved: read

    class _Payload:
        def __reduce__(self):
            return hostile

    real = pickle.loads(metadata.read_bytes())
    if inside:  # hidden among the real records
        real.storage_data = {**real.storage_data, "hidden": _Payload()}
        metadata.write_bytes(pickle.dumps(real))
    else:
        metadata.write_bytes(pickle.dumps(_Payload()))
    with pytest.raises(ckpt.CheckpointError) as refused:
        ckpt.load_training_state(tmp_path, 0, sharded_optimizer=True)
    assert _one_line_naming(str(refused.value), ".metadata") and "other than" in str(refused.value)
    assert not (tmp_path / "ran").exists()
