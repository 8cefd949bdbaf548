"""benchmarks.gpu: a clear exit without a GPU; its case list, memory skips and time budget need no GPU; its
run loop and results files work end to end (here on CPU tensors, on the smoke shape)."""

import dataclasses
import json

import pytest
import torch

from benchmarks import gpu, gpu_plan, report
from benchmarks.paths import PATHS
from benchmarks.shapes import SHAPE_SETS, TARGET_SHAPES

GIB = 2**30


def test_exits_with_a_clear_message_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.main([]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "python -m benchmarks.roofline" in err


def test_case_list_covers_every_path_scenario_and_shape():
    paths = tuple(dict.fromkeys((*PATHS, "gemm")))  # gemm is in PATHS once the API has it
    cases = gpu_plan.case_list(paths)
    ids = {case.id for case in cases}
    assert len(ids) == len(cases)
    for shape in TARGET_SHAPES.values():
        assert f"{shape.id}-loss---floor" in ids and f"{shape.id}-logprobs---floor" in ids
        for path in paths:
            for case_name in ("dapo_kl", "gspo_kl", "dapo_kl_frozen"):
                assert f"{shape.id}-loss-{case_name}-{path}" in ids
            assert f"{shape.id}-logprobs-dapo_kl-{path}" in ids
    for shape in SHAPE_SETS["gpu"]:
        assert f"{shape.id}-loss---floor" in ids and f"{shape.id}-loss-dapo_kl-gemm" in ids
    # the target shapes come first: they are what the time budget protects
    assert cases[0].shape == TARGET_SHAPES["S1"]


def test_plan_skips_what_does_not_fit_and_stays_in_budget():
    plan = gpu_plan.make_plan((*PATHS, "gemm"), 80 * GIB)
    assert plan.benchmark_budget_s == gpu_plan.TOTAL_BUDGET_S - gpu_plan.TESTS_BUDGET_S - gpu_plan.WRITE_MARGIN_S
    assert plan.planned_seconds <= plan.benchmark_budget_s
    skipped = {case.id: reason for case, reason in plan.skipped}
    # the eager reference at S3 needs four fp32 [65536, 151936] tensors: ~150 GiB
    s3 = TARGET_SHAPES["S3"].id
    assert "GiB" in skipped[f"{s3}-loss-dapo_kl-reference"]
    assert all(case.path == "reference" for case, _ in plan.skipped)
    planned = {case.id for case in plan.cases}
    assert f"{s3}-loss-dapo_kl-gemm" in planned and f"{TARGET_SHAPES['S1'].id}-loss-dapo_kl-reference" in planned
    everything = len(plan.cases) + len(plan.over_budget) + len(plan.skipped)
    assert everything == len(gpu_plan.case_list((*PATHS, "gemm")))
    # more memory runs more; no budget at all is refused
    assert len(gpu_plan.make_plan((*PATHS, "gemm"), 141 * GIB).skipped) < len(plan.skipped)
    with pytest.raises(ValueError, match="total_budget_s"):
        gpu_plan.make_plan(PATHS, 80 * GIB, total_budget_s=100)
    with pytest.raises(ValueError, match="device_memory_bytes"):
        gpu_plan.make_plan(PATHS, 0)


def test_rounds_shrink_for_slow_cases_but_never_below_the_minimum():
    fast = gpu_plan.GpuCase("floor", "logprobs", "-", SHAPE_SETS["gpu"][0])
    slow = gpu_plan.GpuCase("torch", "loss", "dapo_kl", SHAPE_SETS["gpu"][-1])
    assert gpu_plan.rounds_for(fast) == gpu_plan.ROUNDS
    assert gpu_plan.MIN_ROUNDS <= gpu_plan.rounds_for(slow) < gpu_plan.ROUNDS


def test_run_loop_and_results_files_on_cpu(tmp_path):
    shape = dataclasses.replace(SHAPE_SETS["smoke"][0], dtype="bfloat16")  # the model covers 16-bit inputs
    cases = [gpu_plan.GpuCase("floor", "loss", "-", shape), gpu_plan.GpuCase("torch", "loss", "dapo_kl", shape),
             gpu_plan.GpuCase("torch", "loss", "dapo_kl_frozen", shape),
             gpu_plan.GpuCase("cce", "loss", "dapo_kl", shape)]
    records, skipped = gpu.run_benchmarks(cases, [], budget_s=60, device=torch.device("cpu"), device_name="test")
    assert [r["extra_info"]["path"] for r in records] == ["floor", "torch", "torch"]
    assert all(r["stats"]["median"] > 0 and r["extra_info"]["valid_tokens"] > 0 for r in records)
    assert len(skipped) == 1 and skipped[0]["reason"].startswith("cce: ")
    # a case that raises is recorded as failed, and the others still run
    broken = gpu_plan.GpuCase("torch", "loss", "no_such_case", shape)
    more, failed = gpu.run_benchmarks([broken, cases[0]], [], budget_s=60, device=torch.device("cpu"),
                                      device_name="test")
    assert len(more) == 1 and f": {gpu.FAILED}: KeyError" in failed[0]["reason"]
    # a spent budget skips the rest with the reason
    _, late = gpu.run_benchmarks(cases[:1], [], budget_s=0, device=torch.device("cpu"), device_name="test")
    assert "budget is spent" in late[0]["reason"]

    json_path = str(tmp_path / "run.json")
    tests = {"command": "python -m pytest -m gpu tests/", "exit_code": 0, "summary": "12 passed in 3.0s",
             "seconds": 3.0}
    meta = gpu.metadata("test CPU", "cpu", "python -m benchmarks.gpu", tests)
    assert gpu.write_results(json_path, meta, records, skipped) == 0
    with open(json_path) as f:
        assert len(json.load(f)["benchmarks"]) == 3
    text = open(json_path[:-5] + ".md").read()
    assert text == report.full_report(report.load_run(json_path))
    assert "GPU tests: `python -m pytest -m gpu tests/`: 12 passed in 3.0s" in text
    assert "cce: " in text and "config `dapo_kl_frozen`" in text
