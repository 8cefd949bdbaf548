"""benchmarks.gpu: a clear exit without a GPU; its case order, memory skips and parts need no GPU; its parts
run, write every item at once, stop at their budget and continue after a kill (here on CPU tensors, on the
smoke shape)."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from benchmarks.gpu import command as gpu, plan as gpu_plan, results as gpu_results
from benchmarks.suite import report
from benchmarks.suite.paths import PATHS
from benchmarks.suite.shapes import SHAPE_SETS, TARGET_SHAPES

GIB = 2**30
CPU = torch.device("cpu")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPE = dataclasses.replace(SHAPE_SETS["smoke"][0], dtype="bfloat16")  # the model covers 16-bit inputs
CASES = [gpu_plan.GpuCase("floor", "loss", "-", SHAPE), gpu_plan.GpuCase("torch", "loss", "dapo_kl", SHAPE),
         gpu_plan.GpuCase("torch", "loss", "dapo_kl_frozen", SHAPE), gpu_plan.GpuCase("cce", "loss", "dapo_kl", SHAPE)]


class Killed(BaseException):
    """Stands in for kill -9 in the middle of a case: nothing after it runs (not an Exception: never caught)."""


def _part(results, cases=CASES, budget_s=600.0, checks=(), need=lambda case, new_shape: 1.0, skipped=()):
    meta = gpu.metadata(CPU, "test CPU")
    return gpu.run_part(results, "python -m benchmarks.gpu --out x", meta, checks,
                        gpu_plan.Plan(list(cases), list(skipped)), budget_s, CPU, "test CPU", need=need)


def _started(results):
    return [event["id"] for event in results.events() if event["event"] == "started"]


def _medians(results):
    return {event["id"]: event["record"]["stats"]["median"] for event in results.events() if event["event"] == "result"}


def test_exits_with_a_clear_message_without_a_gpu(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.main(["--out", str(tmp_path / "run")]) == gpu.EXIT_CANNOT_RUN == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "python -m benchmarks.model.roofline" in err
    assert not (tmp_path / "run").exists()


def test_case_list_puts_the_headline_first():
    paths = gpu_plan.GPU_PATHS
    cases = gpu_plan.case_list(paths)
    ids = [case.id for case in cases]
    assert len(set(ids)) == len(cases)
    for shape in TARGET_SHAPES.values():
        assert f"{shape.id}-loss---floor" in ids and f"{shape.id}-logprobs---floor" in ids
        for path in paths:
            for case_name in ("dapo_kl", "gspo_kl", "dapo_kl_frozen"):
                assert f"{shape.id}-loss-{case_name}-{path}" in ids
            assert f"{shape.id}-logprobs-dapo_kl-{path}" in ids
    for shape in SHAPE_SETS["gpu"]:
        assert f"{shape.id}-loss---floor" in ids and f"{shape.id}-loss-dapo_kl-gemm" in ids
    s1 = TARGET_SHAPES["S1"].id
    # the headline: S1's token-level loss, then S1's no-grad log-probs, each floor first, then auto, gemm, the peers,
    # then every backend of Triton kernels
    assert "triton" in gpu_plan.TRITON_BACKENDS and len(gpu_plan.TRITON_BACKENDS) >= 2
    headline = [f"{s1}-{operation}-{case}-{path}" for operation in ("loss", "logprobs")
                for case, path in [("-", "floor"), *(("dapo_kl", p) for p in ("auto", "gemm", "liger", "cce", "trl",
                                                                            *gpu_plan.TRITON_BACKENDS))]]
    assert ids[:len(headline)] == headline
    assert [gpu_plan.is_headline(case) for case in cases] == \
        [True] * len(headline) + [False] * (len(ids) - len(headline))
    assert f"{s1}-loss-dapo_kl-reference" == ids[len(headline)]  # S1's rest follows on the same inputs
    # one shape after another: each shape's inputs are built once
    shapes = [case.shape for case in cases]
    assert all(shapes.index(s) == i or shapes[i - 1] == s for i, s in enumerate(shapes))
    # the peers before this package's other backends; any new path of PATHS after them
    assert gpu_plan.by_priority(("reference", "torch", "triton", "gemm", "liger", "cce", "trl", "new", "auto")) == \
        ["auto", "gemm", "reference", "liger", "cce", "trl", "torch", "triton", "new"]


def test_the_plan_has_the_smoke_then_the_headline_then_the_tests_and_says_when_the_headline_is_done(capsys):
    plan = gpu_plan.make_plan(gpu_plan.GPU_PATHS, 80 * GIB)
    parts = gpu_plan.schedule(plan)
    steps = [step for part in parts for step in part.steps]
    assert steps[0] == "smoke"
    first_rest = next(i for i, step in enumerate(steps) if isinstance(step, gpu_plan.GpuCase)
                      and not gpu_plan.is_headline(step))
    tests = steps.index("tests")
    assert tests < first_rest and all(gpu_plan.is_headline(step) for step in steps[1:tests])
    assert [step for step in steps if isinstance(step, gpu_plan.GpuCase)] == \
        [case for case in plan.cases if gpu_plan.is_headline(case)] + \
        [case for case in plan.cases if not gpu_plan.is_headline(case)]
    # the tests start only where their whole timeout fits: here the part after the headline's
    tests_part = next(part for part in parts if part.tests)
    assert tests_part.steps[0] == "tests" and tests_part is not parts[0]
    done = gpu_plan.headline_done_s(parts)
    assert gpu_plan.SMOKE_TIMEOUT_S < done <= parts[0].seconds
    assert gpu_plan.main([]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "headline" in line)
    assert f"minute {done / 60:.1f} of part 1" in line and done / 60 <= 5


def test_a_part_runs_the_smoke_then_the_headline_then_the_tests_then_the_rest(tmp_path, monkeypatch):
    results = gpu_results.ResultsDir(str(tmp_path / "run"), "test-cpu")
    results.open()
    headline = [dataclasses.replace(case, shape=SHAPE) for case in gpu_plan.case_list(gpu_plan.GPU_PATHS)[:2]]
    monkeypatch.setattr(gpu_plan, "TARGET_SHAPES", {**TARGET_SHAPES, "S1": SHAPE})
    monkeypatch.setattr(gpu, "is_headline", lambda case: case in headline)
    rest = gpu_plan.GpuCase("torch", "loss", "dapo_kl", SHAPE)
    ok = (sys.executable, "-c", "print('1 passed in 0.1s')")
    smoke, tests = gpu.Check("smoke", ok, 120), gpu.Check("pytest-gpu", ok, 120, after_headline=True)
    summary = _part(results, cases=[rest, *headline], checks=(tests, smoke), budget_s=600.0)
    assert summary.left == [] and summary.failures == []
    assert _started(results) == [smoke.id, headline[0].id, headline[1].id, tests.id, rest.id]
    report_text = (tmp_path / "run" / "test-cpu.md").read_text()
    assert report_text.count("GPU check: `python -c ") == 2  # the smoke's outcome and the tests', in the report
    # a check after the headline waits for a part where its whole timeout fits
    results2 = gpu_results.ResultsDir(str(tmp_path / "run2"), "test-cpu")
    results2.open()
    summary = _part(results2, cases=[rest, *headline], checks=(smoke, gpu.Check("pytest-gpu", ok, 500, True)),
                    budget_s=300.0)
    assert summary.stopped == "budget" and summary.left[0] == "check::pytest-gpu"
    assert _started(results2) == [smoke.id, headline[0].id, headline[1].id]


def test_plan_skips_what_does_not_fit_memory_or_a_part():
    plan = gpu_plan.make_plan((*PATHS, "gemm"), 80 * GIB)
    skipped = {case.id: reason for case, reason in plan.skipped}
    # the eager reference at S3 needs four fp32 [65536, 151936] tensors: ~150 GiB
    s3 = TARGET_SHAPES["S3"].id
    assert "GiB" in skipped[f"{s3}-loss-dapo_kl-reference"]
    assert all(case.path == "reference" for case, _ in plan.skipped)
    planned = {case.id for case in plan.cases}
    assert f"{s3}-loss-dapo_kl-gemm" in planned and f"{TARGET_SHAPES['S1'].id}-loss-dapo_kl-reference" in planned
    assert len(plan.cases) + len(plan.skipped) == len(gpu_plan.case_list((*PATHS, "gemm")))
    # more memory runs more; a case longer than a whole part is skipped with the reason; no budget is refused
    assert len(gpu_plan.make_plan((*PATHS, "gemm"), 141 * GIB).skipped) < len(plan.skipped)
    short = gpu_plan.make_plan(PATHS, 80 * GIB, part_budget_s=60)
    assert any("more than one 60 s part" in reason for _, reason in short.skipped)
    assert all(gpu_plan.fits(0, gpu_plan.seconds_needed(case, True), 60) for case in short.cases)
    with pytest.raises(ValueError, match="part_budget_s"):
        gpu_plan.make_plan(PATHS, 80 * GIB, part_budget_s=10)
    with pytest.raises(ValueError, match="device_memory_bytes"):
        gpu_plan.make_plan(PATHS, 0)


def test_schedule_covers_every_case_once_in_parts_that_fit():
    plan = gpu_plan.make_plan((*PATHS, "gemm"), 80 * GIB)
    parts = gpu_plan.schedule(plan)
    assert sum(part.tests for part in parts) == 1
    assert sorted((case.id for part in parts for case in part.cases)) == sorted(case.id for case in plan.cases)
    assert all(part.seconds <= gpu_plan.PART_BUDGET_S - gpu_plan.WRITE_MARGIN_S for part in parts)
    assert next(part for part in parts if part.tests).seconds >= gpu_plan.TESTS_TIMEOUT_S
    no_tests = gpu_plan.schedule(plan, tests_timeout_s=None, smoke_timeout_s=None)
    assert not any(part.tests for part in no_tests) and len(no_tests) <= len(parts)
    table = "\n".join(gpu_plan.schedule_lines(parts))
    assert "| 1 | correctness smoke, then " in table and "| `pytest -m gpu`, then " in table
    assert f"| {len(parts)} | " in table


def test_rounds_shrink_for_slow_cases_but_never_below_the_minimum():
    fast = gpu_plan.GpuCase("floor", "logprobs", "-", SHAPE_SETS["gpu"][0])
    slow = gpu_plan.GpuCase("torch", "loss", "dapo_kl", SHAPE_SETS["gpu"][-1])
    assert gpu_plan.rounds_for(fast) == gpu_plan.ROUNDS
    assert gpu_plan.MIN_ROUNDS <= gpu_plan.rounds_for(slow) < gpu_plan.ROUNDS


def test_a_part_writes_every_case_and_the_report_from_them(tmp_path):
    results = gpu_results.ResultsDir(str(tmp_path / "run"), "test-cpu")
    results.open()
    memory_skip = gpu_plan.GpuCase("reference", "loss", "dapo_kl", SHAPE)
    summary = _part(results, skipped=[(memory_skip, "reference: needs about 170.0 GiB by the roofline model")])
    assert summary.left == [] and summary.failures == [] and summary.stopped == "done"
    data = json.loads((tmp_path / "run" / "test-cpu.json").read_text())
    assert [b["extra_info"]["path"] for b in data["benchmarks"]] == ["floor", "torch", "torch"]
    assert all(b["stats"]["median"] > 0 and b["extra_info"]["valid_tokens"] > 0 for b in data["benchmarks"])
    reasons = {s["nodeid"]: s["reason"] for s in data["skipped"]}
    assert reasons[f"gpu::{CASES[3].id}"].startswith("cce: cut-cross-entropy is not installed")
    assert "170.0 GiB" in reasons[f"gpu::{memory_skip.id}"]
    meta = data["machine_info"]["grpo_bench"]
    assert meta["command_line"] == "python -m benchmarks.gpu --out x" and meta["parts"][0]["part"] == 1
    for key in ("torch", "triton", "cuda", "driver", "transformers", "liger_kernel", "cut_cross_entropy", "trl",
                "commit", "source_digest"):
        assert key in meta, key
    assert len(meta["source_digest"]) == 12 and meta["source_digest"] == gpu.source_digest()
    text = (tmp_path / "run" / "test-cpu.md").read_text()
    assert text == report.full_report(report.load_run(results.json_path))
    assert "config `dapo_kl_frozen`" in text and "cce: " in text
    assert sorted(os.listdir(tmp_path / "run")) == ["progress.jsonl", "test-cpu.json", "test-cpu.md"]
    # a case that raises is recorded as failed, and the others still run
    broken = gpu_plan.GpuCase("torch", "loss", "no_such_case", SHAPE)
    again = gpu_results.ResultsDir(str(tmp_path / "again"), "test-cpu")
    again.open()
    summary = _part(again, cases=[broken, CASES[0]])
    assert len(_medians(again)) == 1 and f"torch: {gpu_results.FAILED}: KeyError" in summary.failures[0]
    assert "everything is done" in gpu.status_line(summary, again) and "1 failed" in gpu.status_line(summary, again)


def test_a_part_stops_at_its_budget_and_the_next_one_continues(tmp_path):
    results = gpu_results.ResultsDir(str(tmp_path / "run"), "test-cpu")
    results.open()
    # the first case is modelled at 10 s, the others at 100: a budget of margin + 15 s stops before the second
    first = _part(results, budget_s=gpu_plan.WRITE_MARGIN_S + 15,
                  need=lambda case, new_shape: 10.0 if case == CASES[0] else 100.0)
    assert first.stopped == "budget" and first.left == [case.id for case in CASES[1:]]
    assert list(_medians(results)) == [CASES[0].id]
    assert "run the same command again" in gpu.status_line(first, results)
    partial = json.loads(Path(results.json_path).read_text())
    assert len(partial["benchmarks"]) == 1
    assert {s["nodeid"]: s["reason"] for s in partial["skipped"]} == {
        f"gpu::{case.id}": f"{case.path}: not run yet (the same GPU command continues the run)" for case in CASES[1:]}
    measured = _medians(results)
    second = _part(results)
    assert second.part == 2 and second.left == []
    assert not any("not run yet" in s["reason"] for s in json.loads(Path(results.json_path).read_text())["skipped"])
    assert _started(results) == [case.id for case in CASES[:3]]  # nothing measured twice; cce skips unstarted
    assert _medians(results)[CASES[0].id] == measured[CASES[0].id]
    assert [p["part"] for p in json.loads(Path(results.json_path).read_text())["machine_info"]["grpo_bench"]["parts"]] \
        == [1, 2]
    # a third invocation has nothing left to do
    third = _part(results)
    assert third.recorded == [] and third.left == [] and len(_medians(results)) == 3


def test_a_case_killed_mid_run_is_retried_last_then_failed_if_it_dies_again(tmp_path, monkeypatch):
    results = gpu_results.ResultsDir(str(tmp_path / "run"), "test-cpu")
    results.open()
    real_run_case = gpu.run_case

    def killed_on(victim):
        def run_case(case, *args, **kwargs):
            if case.id == victim:
                raise Killed()
            return real_run_case(case, *args, **kwargs)
        return run_case

    monkeypatch.setattr(gpu, "run_case", killed_on(CASES[1].id))
    with pytest.raises(Killed):
        _part(results)
    state = results.progress()
    assert list(state.finished) == [CASES[0].id] and dict(state.starts) == {CASES[1].id: 1}
    # retried after the cases never tried; it dies again
    with pytest.raises(Killed):
        _part(results)
    assert _started(results) == [CASES[0].id, CASES[1].id, CASES[2].id, CASES[1].id]
    monkeypatch.setattr(gpu, "run_case", real_run_case)
    summary = _part(results)
    assert summary.left == [] and _started(results).count(CASES[1].id) == 2  # not started a third time
    assert summary.failures == [f"{CASES[1].id}: torch: {gpu_results.FAILED}: its process died while it ran, 2 "
                                "times (killed at the command's time limit, hung, or crashed); not retried"]
    reasons = [s["reason"] for s in json.loads(Path(results.json_path).read_text())["skipped"]]
    assert any("died while it ran, 2 times" in reason for reason in reasons)


@pytest.mark.slow
def test_a_run_killed_with_sigkill_keeps_what_it_measured_and_continues(tmp_path):
    """A real kill -9 of the process in the middle of its second case, then a second invocation."""
    out = str(tmp_path / "run")
    script = textwrap.dedent(f"""
        import dataclasses, time, torch
        from benchmarks.gpu import command as gpu, plan as gpu_plan, results as gpu_results
        from benchmarks.suite.shapes import SHAPE_SETS
        SHAPE = dataclasses.replace(SHAPE_SETS["smoke"][0], dtype="bfloat16")
        CASES = [gpu_plan.GpuCase(*case, SHAPE) for case in {[(c.path, c.operation, c.case_name) for c in CASES]!r}]
        real = gpu.run_case
        def hang_on_second(case, *args, **kwargs):
            if case.id == CASES[1].id:
                time.sleep(600)
            return real(case, *args, **kwargs)
        gpu.run_case = hang_on_second
        results = gpu_results.ResultsDir({out!r}, "test-cpu")
        results.open()
        gpu.run_part(results, "cmd", {{"device": "test CPU"}}, (), gpu_plan.Plan(CASES, []), 600.0,
                     torch.device("cpu"), "test CPU", need=lambda case, new_shape: 1.0)
    """)
    env = {**os.environ, "PYTHONPATH": REPO_ROOT, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-c", script], cwd=REPO_ROOT, env=env)
    progress = os.path.join(out, gpu_results.PROGRESS_FILE)
    deadline = time.monotonic() + 120
    try:
        while f'"started","id":"{CASES[1].id}"' not in (Path(progress).read_text() if os.path.exists(progress) else ""):
            assert child.poll() is None and time.monotonic() < deadline, "the child never reached its second case"
            time.sleep(0.1)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    results = gpu_results.ResultsDir(out, "test-cpu")
    assert list(_medians(results)) == [CASES[0].id]
    assert len(json.loads(Path(results.json_path).read_text())["benchmarks"]) == 1  # the report was already there
    with open(progress, "a") as f:
        f.write('{"event":"result","id":"torn')  # as if a kill had landed mid-write
    results.open()
    summary = _part(results)
    assert summary.left == [] and set(_medians(results)) == {case.id for case in CASES[:3]}
    assert results.progress().parts[-1]["part"] == 2


def test_gpu_checks_write_their_log_and_outcome(tmp_path):
    results = gpu_results.ResultsDir(str(tmp_path / "run"), "test-cpu")
    results.open()
    passing = gpu.Check("fake-pytest", (sys.executable, "-c", "print('..'); print('== 2 passed in 0.01s ==')"), 60)
    summary = _part(results, cases=CASES[:1], checks=(passing,))
    assert summary.left == []
    log = (tmp_path / "run" / gpu_results.TESTS_LOG_FILE).read_text()
    assert log.startswith(f"$ {sys.executable} -c ") and "(timeout 60 s)\n..\n== 2 passed in 0.01s ==" in log
    meta = json.loads(Path(results.json_path).read_text())["machine_info"]["grpo_bench"]
    assert meta["gpu_tests"]["summary"] == "2 passed in 0.01s" and meta["gpu_tests"]["exit_code"] == 0
    assert "GPU check: `python -c " in (tmp_path / "run" / "test-cpu.md").read_text()
    # a check that outlives its timeout is killed and recorded, not waited for
    hanging = gpu.Check("hang", ("sh", "-c", "echo started; sleep 60"), 1)
    outcome = gpu.run_check(hanging, 1, str(tmp_path / "hang.log"))
    assert outcome["exit_code"] is None and outcome["summary"] == "timed out after 1 s; last line: started"
    # checks come first, and only with time enough left for them
    later = gpu_results.ResultsDir(str(tmp_path / "later"), "test-cpu")
    later.open()
    short = _part(later, cases=CASES[:1], checks=(passing,), budget_s=gpu_plan.WRITE_MARGIN_S + gpu.MIN_CHECK_S - 1)
    assert short.stopped == "budget" and short.left == [passing.id, CASES[0].id]


def test_results_dir_resumes_from_a_copy_and_survives_torn_lines(tmp_path):
    earlier = gpu_results.ResultsDir(str(tmp_path / "earlier"), "x")
    earlier.open()
    earlier.append({"event": "started", "id": "a"})
    earlier.append({"event": "result", "id": "a", "record": {"name": "a"}})
    with open(earlier.tests_log_path, "w") as f:
        f.write("12 passed in 1.0s\n")
    with open(earlier.progress_path, "a") as f:
        f.write('{"event": "started", "id": "b"')  # killed mid-write
    fresh = gpu_results.ResultsDir(str(tmp_path / "fresh"), "x")
    assert fresh.open(resume_from=earlier.out_dir) == f"continuing the run of {earlier.out_dir} in {fresh.out_dir}"
    assert Path(fresh.tests_log_path).read_text() == "12 passed in 1.0s\n"
    fresh.append({"event": "started", "id": "c"})
    state = fresh.progress()
    assert list(state.finished) == ["a"] and dict(state.starts) == {"c": 1}
    assert state.results() == [{"name": "a"}]
    # an out folder with progress of its own keeps it; a missing or empty resume folder starts a new run
    assert fresh.open(resume_from=earlier.out_dir).startswith("continuing the run in")
    assert fresh.progress().starts == state.starts
    (tmp_path / "empty").mkdir()
    for missing in ("elsewhere", "empty"):
        new = gpu_results.ResultsDir(str(tmp_path / f"new-{missing}"), "x")
        assert new.open(resume_from=str(tmp_path / missing)).startswith(f"a new run in {new.out_dir} (")
        assert new.events() == []
    # a rewrite that a kill interrupted leaves no stray file behind
    open(fresh.json_path + ".tmp", "w").close()
    fresh.open()
    assert not os.path.exists(fresh.json_path + ".tmp")


def test_the_same_command_line_runs_the_parts_until_everything_is_done(tmp_path, monkeypatch, capsys):
    """main() end to end with CUDA faked around it: the cases run on CPU tensors, the GPU check is a stand-in."""
    real_run_part = gpu.run_part
    passing = gpu.Check("fake-pytest", (sys.executable, "-c", "print('== 1 passed in 0.01s ==')"), 60)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "Test GPU")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *_: (80 * GIB, 80 * GIB))
    monkeypatch.setattr(gpu, "device_slug", lambda: "test-gpu")
    monkeypatch.setattr(gpu, "make_plan", lambda paths, free, budget: gpu_plan.Plan(list(CASES), []))
    monkeypatch.setattr(gpu, "gpu_checks", lambda: (passing,))
    monkeypatch.setattr(gpu, "metadata", lambda device, name, commit=None: {"device": name, "commit": commit})

    def one_case_per_part(*args, **kwargs):
        asked = []

        def need(case, new_shape):  # the first case of a part fits, the next one would not
            asked.append(case)
            return 1.0 if len(asked) == 1 else 1000.0
        return real_run_part(*args[:6], CPU, args[7], need=need, **kwargs)

    monkeypatch.setattr(gpu, "run_part", one_case_per_part)
    monkeypatch.chdir(tmp_path)  # the out folder is named relative to here
    argv = ["--out", "run", "--budget-s", "100", "--commit", "abc123"]
    assert gpu.main(argv) == gpu.EXIT_MORE
    out = capsys.readouterr().out
    assert f"a new run in {tmp_path / 'run'}" in out and "run the same command again" in out
    assert gpu.main(argv) == gpu.EXIT_MORE  # one case per part
    assert gpu.main(argv) == gpu.EXIT_DONE  # the last case, then cce skips: nothing left
    assert "everything is done after part 3" in capsys.readouterr().out
    assert gpu.main(argv) == gpu.EXIT_DONE
    results = gpu_results.ResultsDir(str(tmp_path / "run"), "test-gpu")
    assert _started(results) == [passing.id, *(case.id for case in CASES[:3])]
    meta = json.loads(Path(results.json_path).read_text())["machine_info"]["grpo_bench"]
    assert meta["command_line"] == "python -m benchmarks.gpu --out run --budget-s 100 --commit abc123"
    assert len(meta["parts"]) == 4 and meta["commit"] == "abc123" and meta["gpu_tests"]["exit_code"] == 0
    # a copy of the folder continues elsewhere (a GPU machine's emptied $OUT); another GPU is refused
    assert gpu.main(["--out", "copy", "--resume", "run"]) == gpu.EXIT_DONE
    assert "continuing the run of" in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "Other GPU")
    assert gpu.main(argv) == gpu.EXIT_CANNOT_RUN
    assert "holds a run on Test GPU; this is Other GPU" in capsys.readouterr().err


def test_the_gpu_checks_name_test_files_that_exist():
    smoke, tests = gpu.gpu_checks()
    assert (smoke.after_headline, tests.after_headline) == (False, True)
    assert smoke.timeout_s == gpu_plan.SMOKE_TIMEOUT_S <= 120
    assert os.path.isfile(os.path.join(gpu.REPO_ROOT, gpu.SMOKE_TESTS)) and gpu.SMOKE_TESTS in smoke.command
    assert f"--ignore={gpu.SMOKE_TESTS}" in tests.command and "tests/" in tests.command
