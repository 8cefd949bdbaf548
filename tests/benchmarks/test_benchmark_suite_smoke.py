"""The benchmark suite itself runs end to end on the smallest CPU shapes, untimed, so it cannot rot."""

import os
import re
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_benchmark_suite_runs_on_smoke_shapes(cpu_only_subprocesses):
    # Peak memory is left out here: the fresh-process measurement has its own test
    # (test_fused_memory_scaling.py), and one process per case would triple this test's time.
    command = [sys.executable, "-m", "pytest", "benchmarks/suite/", "--bench-set=smoke", "--benchmark-disable",
               "--bench-no-memory", "-q", "-rs", "-p", "no:cacheprovider"]
    run = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    passed = int(re.search(r"(\d+) passed", output).group(1))
    # reference and torch run every operation x config x regime on CPU: 2 regimes x (3 + 1 + 3) cases each,
    # plus the two floor cases.
    assert passed >= 2 * 2 * 7 + 2, output[-4000:]
    # Every skip names its reason (a path that is missing or cannot run on CPU says why).
    for line in output.splitlines():
        if line.startswith("SKIPPED"):
            assert re.search(r"\.py:\d+: .{10,}", line), f"skip without a reason: {line}"
