"""`grpo-engine bench`: the architectures, the length search, and a real tiny step per backend."""

from __future__ import annotations

import os
import signal
import warnings

import pytest

from grpo_engine.cli import main
from grpo_engine.resource_limits import usable_cpus
from grpo_engine.tools import bench
from grpo_engine.tools.bench import StepResult, StepSpec, architecture_config, longest_fitting_length
from repo_paths import ROOT

SPEC = StepSpec("qwen2.5-0.5b", "tiny", "torch", batch_size=1, prompt_length=8, completion_length=64,
                dtype="auto", lora=True, device="cpu")


@pytest.mark.parametrize("name, vocab, layers", [("qwen2.5-0.5b", 151936, 24), ("qwen2.5-1.5b", 151936, 28),
                                                 ("qwen2.5-7b", 152064, 28), ("llama-3-8b", 128256, 32)])
def test_tiny_scale_keeps_the_vocabulary_and_shrinks_the_decoder(name, vocab, layers):
    full, tiny = architecture_config(name, "full"), architecture_config(name, "tiny")
    assert (full.vocab_size, full.num_hidden_layers) == (vocab, layers)
    assert tiny.vocab_size == vocab and tiny.num_hidden_layers == bench.TINY_LAYERS
    assert tiny.hidden_size == tiny.num_attention_heads * bench.TINY_HEAD_DIM < full.hidden_size
    assert tiny.num_key_value_heads == full.num_key_value_heads


def test_unknown_architecture_is_named():
    with pytest.raises(ValueError, match="unknown architecture 'gpt-5'"):
        architecture_config("gpt-5", "tiny")


@pytest.mark.parametrize("capacity, expected, probes", [(1000, 960, 6), (256, 256, 4), (100, None, 1),
                                                        (10**6, 4096, 5)])
def test_length_search_doubles_then_bisects(monkeypatch, capacity, expected, probes):
    """A fake probe that fits up to `capacity` tokens: doubling 256, 512, 1024 (miss), bisection to 64."""
    seen = []

    def fake_probe(spec, repeats, budget_bytes, threads=None):
        seen.append(spec.completion_length)
        return StepResult(spec, spec.completion_length <= capacity, None, None, 1)

    monkeypatch.setattr(bench, "run_in_fresh_process", fake_probe)
    longest, count = longest_fitting_length(SPEC, 1, start=256, limit=4096, resolution=64)
    assert (longest, count) == (expected, probes) == (longest, len(seen))
    if expected is not None and expected < 4096:
        assert expected <= capacity < expected + 64


def test_fused_backend_step_needs_less_memory_than_the_reference():
    """Real steps in fresh processes: the reference loss holds [tokens, vocab] fp32 logits (and their
    gradient); the fused backend does not, so its peak is lower by at least one logits tensor."""
    logits_bytes = SPEC.batch_size * SPEC.completion_length * 151936 * 4
    gaps = []
    for _ in range(2):  # peak RSS carries allocator noise of tens of MiB: one more pair before failing
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results = {b: bench.run_in_fresh_process(bench.replace(SPEC, backend=b), 1, None, threads=1)
                       for b in ("reference", "torch")}
        # Python >= 3.12 warns when a process with threads (torch's) forks; the CPU bench forks on purpose, so
        # that each child starts from the parent's imported runtime and its peak is its own step's: no other
        # warning is expected
        unexpected = [w for w in caught if not (issubclass(w.category, DeprecationWarning)
                                                and "use of fork() may lead to deadlocks" in str(w.message))]
        assert not unexpected, [str(w.message) for w in unexpected]
        for result in results.values():
            assert result.error is None and result.fits and result.step_s > 0
        gaps.append(results["reference"].peak_bytes - results["torch"].peak_bytes)
        if gaps[-1] > logits_bytes:
            break
    assert max(gaps) > logits_bytes, f"reference - torch peak {[g / 2**20 for g in gaps]} MiB <= logits"


def _killed(spec, repeats, threads):
    """A measuring child that dies as one the out-of-memory killer takes (SIGKILL: no exception, no result)."""
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_measuring_process_that_dies_is_a_failed_measurement_not_a_hang(monkeypatch):
    """multiprocessing.Pool.apply waited forever for a child killed mid-step (a length search's probe past the
    machine's memory, where the kernel's OOM killer ends it); the fork inherits the patched _measure."""
    monkeypatch.setattr(bench, "_measure", _killed)
    result = bench.run_in_fresh_process(SPEC, 1, None)
    assert not result.fits and "the measuring process died" in result.error and result.step_s is None


def test_cli_prints_a_table_per_backend(capsys, monkeypatch):
    monkeypatch.setattr(bench, "run_in_fresh_process", lambda spec, repeats, budget, threads=None: StepResult(
        spec, budget is None or spec.completion_length <= 512, None, 0.5, 3 * 2**20))
    # a budget and a machine the step's least memory is well within (the reference's logits: 5 GiB at 1024 tokens)
    monkeypatch.setattr(bench, "device_memory", lambda device: (64 * 2**30, "memory and swap"))
    assert main(["bench", "--scale", "tiny", "--device", "cpu", "--backends", "reference", "torch", "--budget-gb", "64",
                 "--max-length", "2048"]) == 0
    assert main(["bench", "--scale", "tiny", "--device", "cpu", "--backends", "torch", "--budget-gb", "64",
                 "--start-length", "128", "--max-length", "300"]) == 0  # 128, 256, 300: the limit fits
    out = capsys.readouterr().out
    assert "qwen2.5-0.5b (tiny) on cpu" in out and "longest completion within 64 GiB" in out
    assert "| reference | 0.500 | 3 | 512 | 6 |" in out and "| torch | 0.500 | 3 | 512 | 6 |" in out
    assert "| torch | 0.500 | 3 | >= 300 (--max-length) | 3 |" in out


@pytest.mark.parametrize("flags, code, message", [
    (["--backends", "fastest"], 1, "--backends: unknown ['fastest']"),
    (["--completion-length", "0"], 2, "argument --completion-length: expected an integer from 1 to 2,147,483,647, "
                                      "got 0"),
    (["--budget-gb", "-2"], 2, "argument --budget-gb: expected a memory budget in GiB, a finite number > 0 and at "
                               "most 1e+06, got '-2'"),
    (["--budget-gb", "nan"], 2, "argument --budget-gb: expected a memory budget in GiB, a finite number > 0 and at "
                                "most 1e+06, got 'nan'"),
    (["--budget-gb", "1e308"], 2, "at most 1e+06, got '1e308'"),  # its bytes overflowed an int
    (["--threads", str(usable_cpus() + 1)], 2, f"argument --threads: expected a thread count (this process may run "
                                               f"on {usable_cpus()} CPU"),  # 100000 crashed OpenMP
    (["--backends", "torch", "torch"], 1, "--backends: ['torch'] named more than once"),
    (["--backends", "triton"], 1, "--backends: ['triton'] run Triton kernels, which need --device cuda"),
    (["--start-length", "512", "--max-length", "256"], 1,
     "--start-length (512) must not exceed --max-length (256)"),
])
def test_bad_flags_are_named(capsys, flags, code, message):
    assert main(["bench", "--scale", "tiny", "--device", "cpu", *flags]) == code
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_every_option_says_what_it_means_and_its_default():
    import argparse

    from grpo_engine.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    options = [a for a in commands.choices["bench"]._actions if a.dest != "help"]
    assert len(options) == 15
    for option in options:
        assert option.help and len(option.help.split()) >= 3, option.option_strings
        if not isinstance(option, argparse._StoreTrueAction):
            assert "default" in option.help, option.option_strings
    backends = next(o for o in options if o.dest == "backends").help
    assert all(name in backends for name in bench.fused_backends())


def test_the_readme_table_is_the_output_of_the_command_it_names():
    import re

    root = ROOT
    readme = (root / "README.md").read_text()
    results = (root / "benchmarks" / "results" / "engine-bench-cpu.md").read_text()
    command = re.search(r"Command: `(grpo-engine bench [^`]*)`", results).group(1)
    assert f"`{command}`" in " ".join(readme.split())  # the README names the command that printed its table
    header = "| backend | step s | peak memory MiB | longest completion that fits | probes |"
    assert header in bench.format_report([], "")  # the columns the command prints
    lines = readme.splitlines()
    start = lines.index(header)
    table = "\n".join(lines[start: lines.index("", start)])
    assert table.count("\n") == 4 and table in results  # verbatim, not retyped
