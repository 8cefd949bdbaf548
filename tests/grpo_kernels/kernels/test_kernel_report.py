"""Every GPU block/warp/stage entry of the Triton launchers compiles for Hopper (sm_90a) and Ampere (sm_80)
without register spills and within the GPU's shared memory, Hopper builds of tensor-core kernels use
wgmma, and those on the Hopper recipe's hot path (the persistent forward) also load through TMA; the committed
compile report of the running triton says so for every build and is current. No GPU needed: triton compiles for a named target, and its bundled cuobjdump reads the cubins. The compiles run in
a subprocess because this process has the Triton interpreter on (it cannot compile), and they are cached
on disk by triton, so a rerun takes seconds."""

import json
import os
import subprocess
import sys

import pytest
import triton  # before benchmarks.model.kernel_report, which turns the interpreter off if triton is not imported yet

from repo_paths import ROOT
COMMITTED = ROOT / "benchmarks" / "results" / "kernels"
MEASURED = ("registers", "stack_bytes", "spill_stores", "shared_bytes", "tma_loads", "wgmma", "mma", "ex2")


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
    done = subprocess.run([sys.executable, "-m", "benchmarks.model.kernel_report", "--heaviest",
                           "--dtypes", "bf16", "fp32",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((out / f"{_name()}.json").read_text())["builds"]


def _name(version: str = triton.__version__) -> str:
    from benchmarks.model.kernel_report import report_name

    return report_name(version)


def _key(row: dict) -> tuple:
    return tuple(row[c] for c in ("kernel", "arch", "dtype", "variant", "block_n", "block_v", "block_k",
                                  "split_tiles", "num_warps", "num_stages"))


@pytest.fixture(scope="module")
def committed():
    path = COMMITTED / f"{_name()}.json"
    assert path.exists(), (f"no committed compile report for triton {triton.__version__} ({path}): run "
                           f"`python -m benchmarks.model.kernel_report` with this triton and commit its output")
    return json.loads(path.read_text())


@pytest.mark.slow  # compiles every kernel for sm_90a / sm_80 in a process of its own
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


@pytest.mark.slow  # compiles every kernel for sm_90a / sm_80 in a process of its own
def test_no_spills_and_hopper_uses_wgmma(report):
    from benchmarks.model.kernel_report import problems

    found = problems(report)
    assert not found, "\n".join(found)
    assert any(r["arch"] == "sm80" and r["mma"] > 0 for r in report), "no Ampere build uses mma.sync"


def test_problems_flags_spills_and_missing_wgmma():
    from benchmarks.model.kernel_report import problems

    clean = dict(kernel="k", arch="sm90", dtype="bf16", variant="-", num_warps=8, num_stages=2, registers=200,
                 stack_bytes=0, spill_stores=0, shared_bytes=100_000, tensor_cores=True, wgmma=4, mma=0,
                 hot_path=True, tma_loads=8)
    assert problems([clean]) == []
    assert "spills" in problems([dict(clean, stack_bytes=8)])[0]
    assert "spills" in problems([dict(clean, spill_stores=1)])[0]
    assert "without wgmma" in problems([dict(clean, wgmma=0, mma=32)])[0]
    assert problems([dict(clean, arch="sm80", wgmma=0, mma=32)]) == []
    assert "shared memory" in problems([dict(clean, shared_bytes=267264)])[0]
    assert "shared memory" in problems([dict(clean, arch="sm80", wgmma=0, shared_bytes=200_000)])[0]
    assert problems([dict(clean, tensor_cores=False, wgmma=0)]) == []
    assert "without TMA loads" in problems([dict(clean, tma_loads=0)])[0]
    assert problems([dict(clean, tma_loads=0, hot_path=False)]) == []  # a build kept for other GPUs
    assert problems([dict(clean, tma_loads=0, tensor_cores=False)]) == []


@pytest.mark.slow  # compiles every kernel for sm_90a / sm_80 in a process of its own
def test_the_hopper_recipe_is_on_the_hot_path(report):
    """The persistent forward and the two-pass backward's dz kernel are built for Hopper with TMA loads and wgmma in
    every 16-bit variant, and every hot-path Hopper tensor-core build has both (problems() fails the run otherwise;
    this says they exist)."""
    recipe = [r for r in report if r["hot_path"] and r["arch"] == "sm90" and r["tensor_cores"]]
    assert {r["kernel"] for r in recipe} == {"_persistent_stats_kernel", "_persistent_dz_kernel"}
    assert {r["dtype"] for r in recipe} == {"bf16"}  # the subset this fixture compiles (fp16 in the full report)
    assert all(r["tma_loads"] > 0 and r["wgmma"] > 0 and r["stack_bytes"] == 0 for r in recipe)


@pytest.mark.slow  # compiles every kernel for sm_90a / sm_80 in a process of its own
def test_committed_report_is_clean_and_current(committed, report):
    """The committed report of this triton: every build the launchers can choose, none with a problem, and the
    heaviest builds compiled now measure what it says (a config or kernel change regenerates it)."""
    from benchmarks.model.kernel_report import problems
    from grpo_kernels.kernels.compile_targets import all_targets

    assert committed["environment"]["triton"] == triton.__version__
    builds = committed["builds"]
    assert {_key(r) for r in builds} == {_key(t.row()) for t in all_targets()}, \
        "the committed report's builds are not the launchers' builds: regenerate it"
    assert not problems(builds), "\n".join(problems(builds))
    by_key = {_key(r): r for r in builds}
    for row in report:
        stored = by_key[_key(row)]
        # ptxas has placed one build at 127 registers in the report's run and 128 in this test's (same triton,
        # same source): a register or two either way is the allocator, not a change; spills and memory are exact
        exact = [c for c in MEASURED if c != "registers"]
        assert {c: stored[c] for c in exact} == {c: row[c] for c in exact} and \
            abs(stored["registers"] - row["registers"]) <= 2, \
            f"{_key(row)}: compiled now {[row[c] for c in MEASURED]}, committed {[stored[c] for c in MEASURED]}"


def test_committed_reports_are_generated_and_named_by_triton_version():
    from benchmarks.model.kernel_report import markdown

    paths = sorted(COMMITTED.glob("*.json"))
    assert len(paths) >= 2, "one report per supported triton (the oldest tested and the newest)"
    for path in paths:
        data = json.loads(path.read_text())
        assert path.name == f"{_name(data['environment']['triton'])}.json"
        assert path.with_name(path.name[:-len(".json")] + ".md").read_text() == markdown(data["builds"],
                                                                                         data["environment"])


@pytest.mark.slow  # compiles for sm_90a in a process of its own
def test_warp_specialized_sweep_candidate_builds_warp_specialized():
    """The tile sweep's warp-specialized candidate (benchmarks/triton_check.persistent_variants) is built by this
    triton as a warp-specialized kernel (setmaxnreg: a load warpgroup and consumer warpgroups), with TMA loads and
    wgmma, no spills and within shared memory, bare and with every flag on: the GPU times what it is meant to."""
    if _cuobjdump_missing():
        pytest.skip("triton's bundled cuobjdump is missing (no NVIDIA backend in this triton build)")
    script = (
        "import json\n"
        "from benchmarks.model.kernel_report import compile_one, compile_target\n"
        "from benchmarks.triton_check import persistent_variants\n"
        "from grpo_kernels.kernels.compile_targets import persistent_forward_target\n"
        "rows = []\n"
        "variants = persistent_variants()\n"
        "for config in [v for v in variants if v.warp_specialize] + [variants[0]]:\n"
        "    for flags in ({}, dict(HAS_BIAS=True, SOFTCAP=True, STORE_CHUNK=True)):\n"
        "        target = persistent_forward_target(config, **flags)\n"
        "        row = compile_one(target)\n"
        "        row['warp_specialized'] = 'setmaxnreg' in compile_target(target).asm['ptx']\n"
        "        rows.append(dict(row, asked=config.warp_specialize, warps=config.num_warps))\n"
        "print(json.dumps(rows))\n")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    from benchmarks.model.kernel_report import problems

    asked = [r for r in rows if r["asked"]]
    assert asked and all(r["warp_specialized"] and r["num_warps"] == 4 for r in asked), asked
    assert not problems(asked), "\n".join(problems(asked))
    # the flag is what makes the difference: the table's entry is not built warp-specialized
    assert [r["warp_specialized"] for r in rows if not r["asked"]] == [False, False]
