"""Every GPU block/warp/stage entry of the Triton launchers compiles for Hopper (sm_90a) and Ampere (sm_80)
without register spills and within the GPU's shared memory, and Hopper builds of tensor-core kernels use
wgmma. No GPU needed: triton compiles for a named target, and its bundled cuobjdump reads the cubins. The compiles run in a
subprocess because this process has the Triton interpreter on (it cannot compile), and they are cached
on disk by triton, so a rerun takes seconds."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _cuobjdump_missing() -> bool:
    import triton

    return not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    if _cuobjdump_missing():
        pytest.skip("triton's bundled cuobjdump is missing (no NVIDIA backend in this triton build)")
    out = tmp_path_factory.mktemp("kernel-report")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # the heaviest constexpr variant of every kernel (all register-costing flags on) bounds the others
    done = subprocess.run([sys.executable, "-m", "benchmarks.kernel_report", "--heaviest", "--dtypes", "bf16", "fp32",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((out / "kernel-report.json").read_text())["builds"]


def test_every_table_entry_is_compiled(report):
    from grpo_kernels.kernels.compile_targets import ARCHS
    from grpo_kernels.kernels.configs import GPU_CONFIGS, dtype_class

    compiled = {(r["arch"], dtype_class(r["dtype"] == "fp32"), r["block_n"], r["block_v"], r["block_k"],
                 r["num_warps"], r["num_stages"]) for r in report}
    for arch in ARCHS:
        for kernel, by_dtype in GPU_CONFIGS[arch].items():
            if kernel == "merge":  # built once per arch, from float32 statistics only
                assert any(r["kernel"].startswith("_merge") and r["arch"] == arch for r in report)
                continue
            for dtype, c in by_dtype.items():
                key = (arch, dtype, c.block_n, c.block_v, c.block_k, c.num_warps, c.num_stages)
                assert key in compiled, f"{arch} {kernel} {dtype} {c} was not compiled"


def test_no_spills_and_hopper_uses_wgmma(report):
    from benchmarks.kernel_report import problems

    found = problems(report)
    assert not found, "\n".join(found)
    assert any(r["arch"] == "sm80" and r["mma"] > 0 for r in report), "no Ampere build uses mma.sync"


def test_problems_flags_spills_and_missing_wgmma():
    from benchmarks.kernel_report import problems

    clean = dict(kernel="k", arch="sm90", dtype="bf16", variant="-", num_warps=8, num_stages=2, registers=200,
                 stack_bytes=0, spill_stores=0, shared_bytes=100_000, tensor_cores=True, wgmma=4, mma=0)
    assert problems([clean]) == []
    assert "spills" in problems([dict(clean, stack_bytes=8)])[0]
    assert "spills" in problems([dict(clean, spill_stores=1)])[0]
    assert "without wgmma" in problems([dict(clean, wgmma=0, mma=32)])[0]
    assert problems([dict(clean, arch="sm80", wgmma=0, mma=32)]) == []
    assert "shared memory" in problems([dict(clean, shared_bytes=267264)])[0]
    assert "shared memory" in problems([dict(clean, arch="sm80", wgmma=0, shared_bytes=200_000)])[0]
    assert problems([dict(clean, tensor_cores=False, wgmma=0)]) == []
