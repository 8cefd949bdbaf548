"""benchmarks.suite.report: ratios, tables, README block and plots from pytest-benchmark JSON."""

import glob
import json
import os

import pytest

from benchmarks.suite import report

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 2**20


def _bench(path, operation, median_s, peak_mib, config="dapo", regime="flat", tokens=1024, **extra):
    info = {"path": path, "operation": operation, "config": config, "regime": regime, "head": "h",
            "hidden": 64, "vocab": 1000, "tokens": tokens, "dtype": "float32", "flops": 6 * tokens * 64 * 1000,
            "peak_extra_bytes": peak_mib * MIB, "mean_entropy": 6.5, **extra}
    return {"name": f"test_{operation}[{path}]", "group": "g", "stats": {"median": median_s}, "extra_info": info}


def _write(tmp_path, benchmarks, skipped=()):
    data = {"machine_info": {"grpo_bench": {"device": "Test CPU", "device_type": "cpu", "torch": "9.9",
                                            "command_line": "pytest benchmarks/"}},
            "commit_info": {"id": "abc"}, "datetime": "2025-01-01", "benchmarks": benchmarks,
            "skipped": list(skipped)}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_ratios_against_reference_and_floor(tmp_path):
    source = _write(tmp_path, [
        _bench("reference", "loss", 0.004, 400),
        _bench("torch", "loss", 0.001, 100),
        _bench("floor", "loss", 0.0005, 50, config="-"),
        _bench("torch", "loss", 0.002, 100, tokens=2048),  # no reference at this size: no ratio
    ])
    run = report.load_run(source)
    reference, floor = report.baselines(run.results)
    torch_1024 = next(r for r in run.results if r.path == "torch" and r.tokens == 1024)
    torch_2048 = next(r for r in run.results if r.path == "torch" and r.tokens == 2048)
    assert report.speedup_vs_reference(torch_1024, reference) == pytest.approx(4.0)
    assert report.times_floor(torch_1024, floor) == pytest.approx(2.0)
    assert report.memory_vs_reference(torch_1024, reference) == pytest.approx(0.25)
    assert report.speedup_vs_reference(torch_2048, reference) is None
    assert torch_1024.tflops == pytest.approx(6 * 1024 * 64 * 1000 / 1e-3 / 1e12)


def test_cuda_event_median_is_preferred_over_wall_clock(tmp_path):
    source = _write(tmp_path, [_bench("torch", "loss", 0.010, 1, cuda_event_median_ms=7.5)])
    assert report.load_run(source).results[0].median_ms == pytest.approx(7.5)


def _two_size_run(tmp_path):
    source = _write(tmp_path, [
        _bench("reference", "loss", 0.004, 400), _bench("torch", "loss", 0.001, 100),
        _bench("reference", "loss", 0.016, 1600, tokens=4096), _bench("torch", "loss", 0.004, 100, tokens=4096),
        _bench("torch", "loss", 0.003, 100, regime="peaked", tokens=4096),
        _bench("floor", "loss", 0.002, 50, config="-", tokens=4096),
    ], skipped=[{"nodeid": "benchmarks/suite/test_loss.py::test_loss[x]", "reason": "cce: needs CUDA"}])
    return report.load_run(source)


def test_markdown_report_and_readme_block(tmp_path):
    run = _two_size_run(tmp_path)
    text = report.full_report(run)
    assert "| h (64, 1000) | 1024 | torch | 1.00 | 4.00x | - |" in text
    assert "cce: needs CUDA" in text
    assert "Test CPU" in text and "`pytest benchmarks/`" in text

    readme = report.readme_block([run])
    assert readme.startswith("<!-- benchmarks:begin") and readme.rstrip().endswith("<!-- benchmarks:end -->")
    assert "| h (64, 1000) | 4096 | flat | torch | 4.00 | 4.00x | 2.00x |" in readme
    assert "| 1024 |" not in readme  # the headline keeps only the largest N per head
    # the bare GEMMs once per head, after its paths' rows
    assert readme.rstrip().splitlines()[-2] == "| h (64, 1000) | 4096 | any | floor (3 GEMMs) | 2.00 | - | 1.00x | 50.0 |"


def test_plots_one_png_per_operation_regime_and_head(tmp_path):
    pytest.importorskip("matplotlib", reason="the plots need matplotlib (pip install matplotlib)")
    written = report.draw_plots(_two_size_run(tmp_path), str(tmp_path / "plots"))
    assert sorted(os.path.basename(p) for p in written) == ["loss-flat-h.png", "loss-peaked-h.png"]
    assert all(os.path.getsize(p) > 1000 for p in written)


def test_load_rejects_foreign_json(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="not pytest-benchmark JSON"):
        report.load_run(str(path))


def _benchmark_results(root: str) -> list[str]:
    """Committed pytest-benchmark runs (the kernel compile reports live in benchmarks/results/kernels/)."""
    return sorted(glob.glob(os.path.join(root, "benchmarks", "results", "*.json")))


@pytest.mark.parametrize("json_path", _benchmark_results(REPO_ROOT))
def test_committed_markdown_is_generated_from_committed_json(json_path, monkeypatch):
    # The committed .md must be exactly what the report makes of the committed JSON: never typed by hand.
    monkeypatch.chdir(REPO_ROOT)
    relative = os.path.relpath(json_path, REPO_ROOT)
    with open(os.path.splitext(json_path)[0] + ".md") as f:
        committed = f.read()
    assert report.full_report(report.load_run(relative)) == committed


def test_readme_table_is_generated_from_the_committed_results():
    """The README's headline table is what the report makes of benchmarks/results/*.json, never typed by hand."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sources = _benchmark_results(root)
    assert sources, "no committed benchmark results"
    cwd = os.getcwd()
    os.chdir(root)  # the block names its sources relative to the repository root
    try:
        expected = report.readme_block([report.load_run(os.path.relpath(p, root)) for p in sources])
    finally:
        os.chdir(cwd)
    with open(os.path.join(root, "README.md")) as f:
        readme = f.read()
    assert expected in readme, "README.md's benchmarks block is stale: run python -m benchmarks.suite.report --update-readme README.md benchmarks/results/cpu-*.json"


def test_gpu_results_carry_the_roofline_prediction(tmp_path):
    from benchmarks.model import roofline

    shape = dict(head="S1", hidden=4096, vocab=151936, tokens=8192, dtype="bfloat16")
    data = {"machine_info": {"grpo_bench": {"device": "NVIDIA H100 80GB HBM3", "device_type": "cuda",
                                            "command_line": "python -m benchmarks.gpu"}},
            "benchmarks": [_bench("gemm", "loss", 0.060, 3000, config="dapo_kl", **shape, valid_tokens=8192,
                                  cuda_event_median_ms=60.0),
                           _bench("floor", "loss", 0.040, 2000, config="-", **shape, cuda_event_median_ms=40.0)]}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(data))
    run = report.load_run(str(path))
    gemm = next(r for r in run.results if r.path == "gemm")
    predicted = roofline.predict_case_ms("NVIDIA H100 80GB HBM3", "gemm", "loss", "dapo_kl", 4096, 151936, 8192,
                                         "bfloat16", 8192)
    assert report.predicted_ms(run, gemm) == pytest.approx(predicted)
    text = report.full_report(run)
    assert "| predicted ms | measured / predicted |" in text
    assert f"| {predicted:,.2f} | {60.0 / predicted:.2f}x |" in text
    floor_predicted = roofline.predict_case_ms("NVIDIA H100", "floor", "loss", "-", 4096, 151936, 8192, "bfloat16")
    assert f"| {floor_predicted:,.2f} | {40.0 / floor_predicted:.2f}x |" in text
    # the README headline takes the GPU command's dapo_kl rows (it has no plain dapo case)
    assert "| S1 (4096, 151936) | 8192 | flat | gemm | 60.00 |" in report.readme_block([run])


def test_cpu_results_have_no_prediction_columns(tmp_path):
    assert "predicted" not in report.full_report(_two_size_run(tmp_path))


def test_model_error_table_gives_each_operation_and_path_its_measured_over_predicted_range():
    from benchmarks.suite import report

    run = report.load_run("benchmarks/results/h200.json")
    table = report.model_error_table(run)
    header = next(line for line in table if line.startswith("| operation |"))
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    row = next(line for line in table if line.startswith("| no-grad log-probs |"))
    cells = dict(zip(columns, (cell.strip() for cell in row.strip("|").split("|"))))
    gemm = [r.median_ms / report.predicted_ms(run, r) for r in run.results
            if r.path == "gemm" and r.operation == "logprobs"]
    assert len(gemm) >= 2
    assert cells["gemm"] == f"{min(gemm):.2f}-{max(gemm):.2f}x"
    cpu = report.load_run(next(p for p in __import__("glob").glob("benchmarks/results/cpu-*.json")))
    assert report.model_error_table(cpu) == []  # CPU runs have no predictions
