"""What plain `pytest` does on a machine with CUDA, checked on a CPU machine: the suite is collected in a
subprocess whose torch reports a GPU (tests/support/fake_cuda_plugin.py). There grpo_kernels leaves the Triton
interpreter off, so the tests that run Triton on CPU tensors (marked `interpreter`) must skip with their reason,
and the `gpu` tests must run."""

import json
import os
import subprocess
import sys

import pytest
from repo_paths import ROOT, SUPPORT


def _collect(tmp_path) -> dict:
    report = tmp_path / "collection.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(COLLECTION_REPORT=str(report), OMP_NUM_THREADS="1",
               PYTHONPATH=f"{ROOT}{os.pathsep}{SUPPORT}")
    # the engine and integration tests run no Triton (and import the most); the engine's own conftest keeps
    # them on the CPU on a GPU machine
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "-p", "fake_cuda_plugin", "tests/grpo_kernels", "--ignore=tests/grpo_kernels/integrations"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(report.read_text())


@pytest.mark.slow  # collects tests/grpo_kernels in a pytest process of its own
def test_on_a_gpu_machine_interpreter_tests_skip_and_gpu_tests_run(tmp_path):
    collected = _collect(tmp_path)
    assert collected["TRITON_INTERPRET"] is None  # as on a GPU machine: grpo_kernels did not turn it on
    tests = collected["tests"]
    interpreted = {name for name, test in tests.items() if "interpreter" in test["markers"]}
    gpu = {name for name, test in tests.items() if "gpu" in test["markers"]}
    for name in interpreted:
        (reason,) = tests[name]["skips"]
        assert reason.startswith("runs Triton kernels on CPU tensors, which needs the Triton interpreter"), name
    for name in gpu:
        assert tests[name]["skips"] == [], name
    # the row kernels are called on CPU tensors; the API tests put Triton's inputs on the GPU when there is one
    assert any(name.startswith("tests/grpo_kernels/test_gemm_path.py::test_triton_row_kernels") for name in interpreted)
    api_triton = [name for name in tests if name.startswith("tests/grpo_kernels/test_api.py::") and "triton" in name]
    assert api_triton and not interpreted & set(api_triton)
    assert len(gpu) >= 10 and len(interpreted) >= 20
