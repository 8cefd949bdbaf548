"""The model's measured rates are what `python -m benchmarks.model.calibrate` fits to the committed GPU run."""

import math

import pytest

from benchmarks.model import calibrate
from benchmarks.suite.report import load_run
from grpo_kernels.cost_model import device


@pytest.fixture(scope="module")
def fitted():
    return calibrate.calibrate(load_run("benchmarks/results/h200.json"))[1]


@pytest.mark.parametrize("name,constant", [
    ("tensor_flops", device.MEASURED_TENSOR_FLOPS),
    ("triton_tensor_flops", device.MEASURED_TRITON_TENSOR_FLOPS),
    ("row_pass_bytes_per_s", device.MEASURED_ROW_PASS_BYTES_PER_S),
])
def test_each_measured_rate_is_the_fit_to_the_committed_h200_run(fitted, name, constant):
    assert getattr(fitted, name) == pytest.approx(constant, rel=0.03)


def test_the_fitted_model_predicts_the_headline_within_a_quarter_but_for_the_known_log_prob_gap(fitted):
    run = load_run("benchmarks/results/h200.json")
    headline = [r for r in run.results if r.head == "S1" and r.path in ("floor", "gemm", "auto", "trl", "cce")
                and (r.operation == "logprobs" or r.config == "dapo_kl" or r.path == "floor")]
    assert len(headline) >= 10
    # the gemm and auto training cases ran the dW adds the model no longer describes (calibrate.TRITON_DW_RUNS)
    assert {(r.path, r.operation) for r in headline if not calibrate.modelled(run, r)} == {("gemm", "loss"),
                                                                                         ("auto", "loss")}
    headline = [r for r in headline if calibrate.modelled(run, r)]
    off = {(r.path, r.operation) for r in headline
           if abs(math.log(r.median_ms / calibrate.predicted_ms(r, fitted))) > math.log(1.25)}
    # the no-grad log-probs of the cuBLAS-and-row-pass paths take 1.3-1.5x what the four rates explain
    # (docs/benchmarks.md, "The first GPU run"): stated here so that a change of it shows
    assert off == {("gemm", "logprobs"), ("auto", "logprobs"), ("trl", "logprobs")}


def test_a_cpu_run_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="no rates"):
        calibrate.calibrate(load_run(next(__import__("glob").iglob("benchmarks/results/cpu-*.json"))))
