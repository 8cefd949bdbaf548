"""`python -m grpo_engine.tools.parallel_memory`: its options are checked before any run starts, and each torchrun process
of a run reports its peak resident set, also when training fails (the 2-process DDP vs FSDP runs themselves are
the measurement in docs/engine.md, too slow for the suite)."""

import json

import pytest

from grpo_engine.tools.parallel_memory import main, report_worker


@pytest.mark.parametrize("argv, message", [
    (["--processes", "1"], "argument --processes: expected a number of processes from 2"),
    (["--steps", "0"], "argument --steps: expected an integer from 1"),
    (["--mmap-threshold", "-1"], "argument --mmap-threshold: expected a number of bytes from 0"),
])
def test_bad_options_are_refused_before_any_run(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
def test_a_process_reports_its_peak_resident_set(tmp_path, small_overrides, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    flags = [f"--{key}={json.dumps(value) if isinstance(value, (bool, list)) else value}"
             for key, value in {**small_overrides, "run.max_steps": 1}.items()]
    assert report_worker(tmp_path, flags) == 0
    assert json.loads((tmp_path / "rank-1.json").read_text())["peak_rss_mb"] > 100  # the torch runtime alone
    (tmp_path / "rank-1.json").unlink()
    assert report_worker(tmp_path, ["--optim.learning_rate=-1"]) == 2  # a config error: status 2, still reported
    assert (tmp_path / "rank-1.json").is_file()
