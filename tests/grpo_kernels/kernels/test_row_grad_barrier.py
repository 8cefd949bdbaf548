"""The in-place row-gradient kernel (kernels/rows.py) narrows dZ to 16 bits over the float32 logits it reads; its
GPU builds must hold a barrier between each chunk's loads and its stores, or one warp's 16-bit stores can land on
float32 logits another warp has not loaded yet. Checked in the PTX of every 16-bit build, for sm_90a and sm_80,
compiled without a GPU (in a subprocess: this process runs the Triton interpreter, which cannot compile)."""

import json
import os
import re
import subprocess
import sys

import pytest

from repo_paths import ROOT

_DUMP_PTX = """
import json, sys
from benchmarks.model.kernel_report import compile_target  # turns the interpreter off before triton is imported
from grpo_kernels.kernels.compile_targets import all_targets

ptx = {f"{t.arch} {t.dtype} {t.variant}": compile_target(t).asm["ptx"]
       for t in all_targets(dtypes=("bf16", "fp16", "fp32")) if t.kernel == "_row_grad_kernel"
       and (t.dtype != "fp32" or t.variant == "HAS_BIAS,HAS_ENT_GRAD")}
json.dump(ptx, open(sys.argv[1], "w"))
"""

_LABEL = re.compile(r"^(\$L__BB\w+):")
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L__BB\w+);")
_BARRIER = re.compile(r"\b(?:bar|barrier)(?:\.cta)?\.sync\b")


def loops(ptx: str) -> list[list[str]]:
    """The instruction lines of each loop: from a label to the last branch back to it."""
    lines = [line.strip() for line in ptx.splitlines()]
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := _LABEL.match(line))}
    bodies = {}
    for i, line in enumerate(lines):
        m = _BRANCH.search(line)
        if m and labels.get(m.group(1), i) < i:
            bodies[m.group(1)] = lines[labels[m.group(1)]:i + 1]
    return list(bodies.values())


def barrier_splits_loads_from_stores(body: list[str]) -> bool:
    """Every global load of the loop comes before a barrier that comes before every global store."""
    loads = [i for i, line in enumerate(body) if "ld.global" in line]
    stores = [i for i, line in enumerate(body) if "st.global" in line]
    barriers = [i for i, line in enumerate(body) if _BARRIER.search(line)]
    return bool(loads and stores) and any(max(loads) < b < min(stores) for b in barriers)


def test_loop_parser_finds_the_barrier():
    body = ["$L__BB0_2:", "ld.global.b32 {%r1}, [%rd1];", "bar.sync 0;", "st.global.b16 [%rd2], {%rs1};",
            "@%p1 bra $L__BB0_2;"]
    assert [len(b) for b in loops("\n".join(["mov.u32 %r0, 0;", *body, "ret;"]))] == [5]
    assert barrier_splits_loads_from_stores(body)
    assert not barrier_splits_loads_from_stores([body[0], body[2], body[1], *body[3:]])  # barrier before a load
    assert not barrier_splits_loads_from_stores([body[0], body[1], body[3], body[2], body[4]])  # after a store
    assert not loops("\n".join(body[:-1] + ["@%p1 bra $L__BB0_3;", "$L__BB0_3:"]))  # a forward branch


@pytest.fixture(scope="module")
def row_grad_ptx(tmp_path_factory):
    import triton.backends

    if "nvidia" not in triton.backends.backends:
        pytest.skip("this triton build has no NVIDIA backend to compile with")
    out = tmp_path_factory.mktemp("row-grad-ptx") / "ptx.json"
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", _DUMP_PTX, str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


def test_every_narrowing_build_has_a_barrier_between_loads_and_stores(row_grad_ptx):
    narrowing = {name: ptx for name, ptx in row_grad_ptx.items() if " fp32 " not in name}
    assert len(narrowing) == 32  # sm_90a / sm_80 x bf16 / fp16 x bias x entropy gradient x soft-cap
    for name, ptx in narrowing.items():
        bodies = loops(ptx)
        assert bodies, f"{name}: no loop found in the PTX"
        assert any(barrier_splits_loads_from_stores(body) for body in bodies), \
            f"{name}: no barrier between the vocabulary loop's loads and its stores"


def test_float32_dz_needs_no_barrier(row_grad_ptx):
    """float32 dZ overwrites exactly the element the same thread loaded: no barrier is paid for."""
    full = {name: ptx for name, ptx in row_grad_ptx.items() if " fp32 " in name}
    assert len(full) == 2
    for name, ptx in full.items():
        assert not _BARRIER.search(ptx), f"{name}: a barrier the float32 build does not need"
