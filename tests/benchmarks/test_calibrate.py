"""The model's measured rates are what `python -m benchmarks.model.calibrate` fits to the committed GPU run."""

import dataclasses

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


def test_the_fit_lowers_the_models_error_on_the_run_it_fits():
    run = load_run("benchmarks/results/h200.json")
    before, after = calibrate.calibrate(run)
    cases = [r for r in run.results if r.regime in ("flat", "any") and calibrate.modelled(run, r)]
    assert len(cases) >= 10
    assert calibrate.log_error(cases, after) <= calibrate.log_error(cases, before)


@pytest.mark.parametrize("name, scale", [("tensor_flops", 0.7), ("row_pass_bytes_per_s", 1.4)])
def test_a_rate_is_recovered_from_timings_it_generated(name, scale):
    """Timings made by the model at a known rate, on the committed run's cases that fit it: the fit finds that
    rate again."""
    run = load_run("benchmarks/results/h200.json")
    before, _ = calibrate.calibrate(run)
    truth = dataclasses.replace(before, **{name: getattr(before, name) * scale})
    selects = next(selects for fitted_name, _, selects in calibrate.FITS if fitted_name == name)
    cases = [dataclasses.replace(r, median_ms=calibrate.predicted_ms(r, truth)) for r in run.results
             if selects(r) and r.regime in ("flat", "any") and calibrate.modelled(run, r)]
    assert cases and calibrate.log_error(cases, truth) == 0.0
    assert calibrate.fit_rate(name, cases, before) == pytest.approx(getattr(truth, name), rel=0.01)


def test_a_cpu_run_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="no rates"):
        calibrate.calibrate(load_run(next(__import__("glob").iglob("benchmarks/results/cpu-*.json"))))
