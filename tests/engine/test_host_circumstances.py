"""train() called from Python hosts (a notebook's cell, a script's loop) after the caller's own torch settings, and
given what the caller holds rather than what load_config returned.

Before: a default dtype of float64 trained other numbers than a terminal run with the same seed; a default device
of `meta`, or grad mode off (set_grad_enabled(False), no_grad, inference_mode around the call) stopped deep in torch
("Cannot copy out of meta tensor", "element 0 of tensors does not require grad"); the run left torch's thread
count at run.num_threads and the random number generators at the run's; and train(a dict or a path) was an
AttributeError, a config set after load so that a rule across sections broke trained on.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_engine.config import ConfigError, load_config
from grpo_engine.host_state import run_process_state
from grpo_engine.trainer import train

CALLER_STATE = st.fixed_dictionaries({
    "dtype": st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
    "device": st.sampled_from([None, "meta", "cpu"]),
    "grad": st.booleans(),
    "inference": st.booleans(),
    "autocast": st.booleans(),
    "threads": st.integers(1, 2),
    "seed": st.integers(0, 2**32 - 1),
})


class CallerState:
    """The caller's settings applied for the body, and what they read as just before the call."""

    def __init__(self, drawn: dict) -> None:
        self.drawn = drawn

    def __enter__(self) -> "CallerState":
        d = self.drawn
        self.saved = (torch.get_default_dtype(), torch.get_num_threads(), torch.is_grad_enabled())
        torch.set_default_dtype(d["dtype"])
        torch.set_num_threads(d["threads"])
        torch.set_grad_enabled(d["grad"])
        if d["device"] is not None:
            torch.set_default_device(d["device"])
        self.inference = torch.inference_mode(d["inference"])
        self.inference.__enter__()
        self.autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=d["autocast"])
        self.autocast.__enter__()
        torch.manual_seed(d["seed"])
        random.seed(d["seed"])
        np.random.seed(d["seed"] % 2**32)
        self.before = self.read()
        return self

    @staticmethod
    def read() -> tuple:
        return (torch.get_default_dtype(), torch.get_default_device(), torch.is_grad_enabled(),
                torch.is_inference_mode_enabled(), torch.is_autocast_enabled("cpu"), torch.get_num_threads(),
                torch.get_rng_state(), random.getstate(), str(np.random.get_state()))

    def __exit__(self, *exc) -> None:
        self.autocast.__exit__(*exc)
        self.inference.__exit__(*exc)
        if self.drawn["device"] is not None:
            torch.set_default_device(None)
        dtype, threads, grad = self.saved
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)
        torch.set_grad_enabled(grad)


def _same(a: tuple, b: tuple) -> bool:
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))


@settings(max_examples=40, deadline=None)
@given(drawn=CALLER_STATE)
def test_the_run_gets_the_same_process_state_in_every_host_and_the_caller_gets_theirs_back(drawn):
    with CallerState(drawn) as caller:
        with run_process_state():
            # what a terminal's run starts with
            assert torch.get_default_dtype() == torch.float32
            assert torch.get_default_device() == torch.device("cpu")
            assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
            assert not torch.is_autocast_enabled("cpu")
            weight = torch.ones(3, requires_grad=True)
            (weight * 2).sum().backward()  # autograd works here
            assert weight.grad is not None and weight.grad.dtype == torch.float32
            # what a run changes: its thread count and its seeds
            torch.set_num_threads(3 - drawn["threads"])
            torch.manual_seed(1), random.seed(1), np.random.seed(1), torch.rand(2)
        assert _same(CallerState.read(), caller.before)


def test_the_caller_gets_their_state_back_when_the_run_raises():
    with CallerState({"dtype": torch.float64, "device": None, "grad": False, "inference": False, "autocast": False,
                      "threads": 1, "seed": 3}) as caller:
        with pytest.raises(RuntimeError, match="inside"), run_process_state():
            torch.set_num_threads(2)
            torch.manual_seed(9)
            raise RuntimeError("inside")
        assert _same(CallerState.read(), caller.before)


@pytest.mark.parametrize("given_as", ["dict", "path", "None", "section"])
def test_train_takes_an_engine_config_in_one_line_before_any_work(given_as, small_overrides, tmp_path):
    config = load_config(overrides=small_overrides)
    value = {"dict": small_overrides, "path": str(tmp_path / "config.yaml"), "None": None,
             "section": config.run}[given_as]
    with pytest.raises(ConfigError) as refused:
        train(value)
    assert str(refused.value).startswith("train(config): expected an EngineConfig"), str(refused.value)
    assert not Path(small_overrides["run.output_dir"]).exists()


def _broken_after_load(config):
    config.rollout.max_new_tokens = 4  # each section valid alone: rewards.length_cache 8 is now past it
    return config


@pytest.mark.parametrize("build, named", [
    (_broken_after_load, "rewards.length_cache"),
    (lambda c: c.model_copy(update={"run": {"max_steps": -1}}), "run.max_steps"),
    (lambda c: type(c).model_construct(**{**dict(c), "optim": {"learning_rate": "fast"}}), "optim"),
])
def test_a_config_set_or_built_past_validation_is_checked_again_in_one_line(build, named, small_overrides):
    with pytest.raises(ConfigError) as refused:
        train(build(load_config(overrides=small_overrides)))
    message = str(refused.value)
    assert "\n" not in message and named in message, message
    assert not Path(small_overrides["run.output_dir"]).exists()


def _metrics_rows(run_dir: str) -> list[tuple]:
    import json

    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [(row["step"], row["loss"], row["reward"]) for row in rows if "loss" in row]


@pytest.mark.slow
@settings(max_examples=3, deadline=None)
@given(drawn=CALLER_STATE)
def test_train_under_a_callers_torch_settings_trains_the_terminals_numbers_and_gives_them_back(
        drawn, tmp_path_factory):
    overrides = {"run.max_steps": 2, "run.progress_bar": False, "run.plot": False, "run.log_completions_steps": 0,
                 "run.loss_backend": "torch", "data.builtin_max_operand": 2, "rollout.num_generations": 4,
                 "rollout.max_new_tokens": 8, "optim.per_device_train_batch_size": 8, "optim.learning_rate": 1e-2,
                 "rewards.functions": ["math_accuracy", "length"], "rewards.length_cache": 8, "run.num_threads": 1}
    plain = train(load_config(overrides={**overrides, "run.output_dir": str(tmp_path_factory.mktemp("plain"))}))
    with CallerState(drawn) as caller:
        hosted = train(load_config(overrides={**overrides, "run.output_dir": str(tmp_path_factory.mktemp("host"))}))
        assert _same(CallerState.read(), caller.before)
    assert _metrics_rows(hosted.run_dir) == _metrics_rows(plain.run_dir)


@pytest.mark.parametrize("timeout, save, said", [(30.0, True, ("rewards.timeout_seconds (30 s)", "Ctrl-C")),
                                                 (None, True, ("Ctrl-C",)), (5.0, False, ("(5 s)",)),
                                                 (None, False, ())])
def test_train_in_another_thread_says_what_it_goes_without(timeout, save, said, small_overrides, monkeypatch, caplog):
    import threading

    from grpo_engine import trainer

    monkeypatch.setattr(trainer, "_train", lambda config: None)  # what is said before the run is what is tested
    config = load_config(overrides={**small_overrides, "rewards.timeout_seconds": timeout,
                                    "run.save_on_interrupt": save})
    worker = threading.Thread(target=train, args=(config,), name="cell-worker")
    with caplog.at_level("WARNING", logger="grpo_engine"):
        worker.start()
        worker.join()
        train(config)  # the main thread: nothing to say
    notes = [r.getMessage() for r in caplog.records if "not the main thread" in r.getMessage()]
    assert len(notes) == (1 if said else 0), notes
    if said:
        assert all(part in notes[0] for part in said) and "\n" not in notes[0] and "'cell-worker'" in notes[0]
