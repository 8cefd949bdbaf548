"""What the tools are given is refused in one line before their work: sizes past the machine's memory (bench,
rollout_speed), the flags a tool passes on to `grpo-engine train` (demo_seeds), flags a tool does not take
(parallel_memory), seeds given twice, and the model and Python `grpo-engine serve` starts vLLM with. Each was found
by the work itself before: a traceback from torch's allocator, a probe that swapped for minutes, a failed run's log,
flags dropped without a word, vLLM's own start-up failure."""

from __future__ import annotations

import sys

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings, strategies as st
from transformers import AutoModelForCausalLM

from grpo_engine.config import ConfigError, leaf_keys
from grpo_engine.rollout import registry
from grpo_engine.tools import bench, demo_seeds, parallel_memory, rollout_speed
from grpo_engine.tools.bench_memory import least_step_bytes, weight_count
from grpo_engine.tools.bench_options import ARCHITECTURES, build_parser as bench_parser
from grpo_engine.tools.serve import check_server_inputs

GIB = 2**30
MACHINE = (16 * GIB, "memory and swap")  # the machine these tests pretend to run on
FIXTURES = [HealthCheck.function_scoped_fixture]


class Ran(Exception):
    """The tool's work started."""


def _refuse_work(*args, **kwargs):
    raise Ran()


@pytest.mark.parametrize("model", sorted(ARCHITECTURES))
@pytest.mark.parametrize("scale", ["full", "tiny"])
def test_the_weight_count_is_a_lower_bound_of_the_model_built(model, scale):
    config = bench.architecture_config(model, scale)
    with torch.device("meta"):
        built = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    assert 0.95 * built <= weight_count(config) <= built


@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURES)
@given(model=st.sampled_from(sorted(ARCHITECTURES)), scale=st.sampled_from(["full", "tiny"]),
       batch=st.integers(1, 2**31 - 1), prompt=st.integers(1, 2**31 - 1), completion=st.integers(1, 2**31 - 1),
       lora=st.booleans())
def test_a_bench_step_past_the_memory_is_refused_naming_its_sizes_before_any_process(
        model, scale, batch, prompt, completion, lora, monkeypatch):
    monkeypatch.setattr(bench, "device_memory", lambda device: MACHINE)
    monkeypatch.setattr(bench, "run_in_fresh_process", _refuse_work)
    argv = ["--model", model, "--scale", scale, "--batch-size", str(batch), "--prompt-length", str(prompt),
            "--completion-length", str(completion), "--device", "cpu", "--backends", "reference", "torch"]
    args = bench_parser().parse_args(argv + ["--lora"] * lora)
    config = bench.architecture_config(model, scale)
    least = least_step_bytes(config, weight_count(config), batch, prompt, completion, 4, lora, forms_logits=True)
    if least <= MACHINE[0]:
        with pytest.raises(Ran):
            bench.run_bench(args)
        return
    with pytest.raises(ValueError) as refused:
        bench.run_bench(args)
    text = str(refused.value)
    assert "\n" not in text and f"--batch-size {batch}" in text and f"--completion-length {completion}" in text
    assert "16.0 GiB of memory and swap" in text


@settings(max_examples=40, deadline=None, suppress_health_check=FIXTURES)
@given(start=st.integers(1, 2**31 - 1), limit=st.integers(1, 2**31 - 1), room=st.integers(1, 2**40))
def test_the_length_search_never_runs_a_probe_that_cannot_fit(start, limit, room, monkeypatch):
    """`--start-length 2147483647` ran a probe that swapped for over five minutes."""
    assume(start <= limit)
    ran = []

    def probe(spec, repeats, budget, threads=None):
        ran.append(spec.completion_length)
        return bench.StepResult(spec, spec.completion_length * 1000 <= room, None, None, 1)

    monkeypatch.setattr(bench, "run_in_fresh_process", probe)
    spec = bench.StepSpec("qwen2.5-0.5b", "tiny", "torch", 1, 1, start, "auto", True, "cpu")
    bench.longest_fitting_length(spec, room, start, limit, 64, certain_miss=lambda length: length * 1000 > room)
    assert all(length * 1000 <= room for length in ran), ran


@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURES)
@given(heads=st.integers(1, 2**26 - 1), layers=st.integers(1, 2**31 - 1))
def test_a_rollout_speed_model_past_the_memory_is_refused_naming_its_size_before_it_is_built(
        heads, layers, monkeypatch, capsys):
    hidden = 32 * heads
    monkeypatch.setattr(registry.RolloutSpec, "check_installed", lambda self: None)  # vLLM is not needed to refuse
    monkeypatch.setattr("grpo_engine.tools.bench_memory.device_memory", lambda device: MACHINE)
    monkeypatch.setattr(rollout_speed, "build_model", _refuse_work)
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)
    layer_bytes = 2 * 4 * layers * 11 * hidden * hidden  # float32, held twice: each layer's MLP (9 h^2), q and o
    capsys.readouterr()
    with pytest.raises((Ran, SystemExit)) as stop:
        rollout_speed.main(["--hidden", str(hidden), "--layers", str(layers)])
    if layer_bytes > MACHINE[0]:
        lines = capsys.readouterr().err.splitlines()
        assert isinstance(stop.value, SystemExit) and stop.value.code == 2, stop.value
        assert len(lines) == 1 and f"--hidden {hidden} with --layers {layers}" in lines[0], lines
    elif layer_bytes + 2 * 4 * 99 * hidden <= MACHINE[0]:  # with the embeddings: fits
        assert isinstance(stop.value, Ran)


def test_rollout_speed_says_vllm_is_missing_before_the_model_is_built(monkeypatch):
    monkeypatch.setattr(rollout_speed, "build_model", _refuse_work)
    spec = registry.ROLLOUT_BACKENDS["vllm"]
    if spec.requires is None or __import__("importlib").util.find_spec(spec.requires[0]) is not None:
        pytest.skip("vLLM is installed here")
    with pytest.raises(ConfigError, match="rollout.backend vllm needs vLLM"):
        rollout_speed.main(["--hidden", "32", "--layers", "1"])


TRAIN_KEYS = sorted(leaf_keys())


@settings(max_examples=40, deadline=None, suppress_health_check=FIXTURES)
@given(key=st.sampled_from(TRAIN_KEYS), cut=st.integers(0, 40), twice=st.booleans())
def test_demo_seeds_refuses_a_misspelt_train_flag_or_a_seed_twice_before_the_first_run(key, cut, twice, tmp_path,
                                                                                        monkeypatch, capsys):
    misspelt = key[:cut % len(key)] + key[cut % len(key) + 1:]  # one letter dropped
    assume(misspelt not in TRAIN_KEYS and misspelt.strip(".") == misspelt and misspelt)
    monkeypatch.setattr(demo_seeds, "run_seed", _refuse_work)
    seeds = ["0", "1", "0"] if twice else ["0"]
    capsys.readouterr()
    with pytest.raises((ConfigError, SystemExit)) as stop:
        demo_seeds.main(["--seeds", *seeds, "--output-dir", str(tmp_path / "runs"), "--", f"--{misspelt}", "1"])
    if twice:
        refusal = capsys.readouterr().err
        assert isinstance(stop.value, SystemExit) and "argument --seeds: 0 given more than once" in refusal
    else:
        assert isinstance(stop.value, ConfigError) and f"unknown flag --{misspelt}" in str(stop.value)


@pytest.mark.parametrize("flags, message", [
    (["--run.max_steps", "-4"], "run.max_steps: expected a value >= 1, got -4"),
    (["--max-steps", "abc"], "run.max_steps: expected an integer, got 'abc'"),
    (["--optim.learning_rate", "nan"], "optim.learning_rate"),
])
def test_demo_seeds_refuses_a_train_flag_value_before_the_first_run(flags, message, tmp_path, monkeypatch):
    monkeypatch.setattr(demo_seeds, "run_seed", _refuse_work)
    with pytest.raises(ConfigError, match="the flags for grpo-engine train: ") as refused:
        demo_seeds.main(["--seeds", "0", "--output-dir", str(tmp_path / "runs"), "--", *flags])
    assert message in str(refused.value)


@settings(max_examples=30, deadline=None, suppress_health_check=FIXTURES)
@given(flag=st.from_regex(r"--[a-z][a-z_.-]{1,12}", fullmatch=True), value=st.sampled_from(["", "wide", "3"]))
def test_parallel_memory_refuses_a_flag_it_does_not_take_before_any_run(flag, value, monkeypatch, capsys):
    """`--sclae wide` was dropped without a word: the demo scale measured."""
    assume(flag not in ("--scale", "--processes", "--steps", "--mmap-threshold", "--report", "--help"))
    assume(not any(option.startswith(flag) for option in ("--scale", "--processes", "--steps", "--mmap-threshold")))
    monkeypatch.setattr(parallel_memory, "run_mode", _refuse_work)
    monkeypatch.setattr(parallel_memory, "demo_parameters", _refuse_work)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        parallel_memory.main([flag, value] if value else [flag])
    lines = capsys.readouterr().err.splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and flag in lines[0]


MODELS = st.sampled_from(["a directory", "a Hub id", "missing", "a file", "empty"])
PYTHONS = st.sampled_from(["this Python", "missing", "a directory", "a file that does not run"])


@settings(max_examples=40, deadline=None, suppress_health_check=FIXTURES)
@given(model=MODELS, python=PYTHONS)
def test_serve_refuses_a_model_or_python_vllm_cannot_start_from_before_starting_it(model, python, tmp_path):
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "notes.txt").write_text("x")
    model_path = {"a directory": str(tmp_path / "model"), "a Hub id": "Qwen/Qwen2.5-0.5B",
                  "missing": str(tmp_path / "gone"), "a file": str(tmp_path / "notes.txt"), "empty": ""}[model]
    python_path = {"this Python": sys.executable, "missing": str(tmp_path / "no-python"),
                   "a directory": str(tmp_path / "model"),
                   "a file that does not run": str(tmp_path / "notes.txt")}[python]
    good_model, good_python = model in ("a directory", "a Hub id"), python == "this Python"
    try:
        check_server_inputs(model_path, python_path)
    except ConfigError as exc:
        assert not (good_model and good_python)
        assert ("--model" in str(exc)) == (not good_model) and "\n" not in str(exc)
        return
    assert good_model and good_python


@settings(max_examples=30, deadline=None, suppress_health_check=FIXTURES)
@given(processes=st.integers(2, 2**31 - 1))
def test_parallel_memory_refuses_more_processes_than_the_memory_holds_before_any_run(processes, monkeypatch, capsys):
    """`--processes 100000` started torchrun on 100000 processes."""
    monkeypatch.setattr("grpo_engine.tools.bench_memory.device_memory", lambda device: MACHINE)
    monkeypatch.setattr(parallel_memory, "run_mode", _refuse_work)
    monkeypatch.setattr(parallel_memory, "demo_parameters", _refuse_work)
    capsys.readouterr()
    with pytest.raises((Ran, SystemExit)) as stop:
        parallel_memory.main(["--processes", str(processes)])
    if processes * parallel_memory.PROCESS_FLOOR_BYTES > MACHINE[0]:
        lines = capsys.readouterr().err.splitlines()
        assert isinstance(stop.value, SystemExit) and len(lines) == 1 and "argument --processes" in lines[0]
    else:
        assert isinstance(stop.value, Ran)
