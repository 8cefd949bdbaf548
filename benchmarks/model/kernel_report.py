"""Compile report of the Triton kernels, no GPU needed: every build the launchers can choose
(grpo_kernels/kernels/compile_targets.py), compiled for sm_90a and sm_80, with registers, stack / spill
bytes, shared memory and tensor-core instruction counts read from the cubin by triton's own cuobjdump.
Register allocation differs between triton releases (their LLVM and ptxas), so each report names its triton
version, and one is committed per supported triton (the oldest tested and the newest).

    python -m benchmarks.model.kernel_report   # -> benchmarks/results/kernels/kernel-report-triton-<version>.{md,json}
    python -m benchmarks.model.kernel_report --heaviest --dtypes bf16 fp32 --out /tmp/report   # the CI subset

Triton caches each compiled kernel on disk, so a second run takes seconds.
"""

from __future__ import annotations

import os
import sys

# Compiling for a GPU needs triton's compiler, not its interpreter, and that is decided when triton is
# imported (`import grpo_kernels` turns the interpreter on where there is no CUDA). Importing this module
# after triton (e.g. from a test, for `problems`) is fine; only compiling then is refused, in main().
if "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "0"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the launchers' default; silences triton's notice

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

from grpo_engine.cli_parser import CommandParser  # noqa: E402
from grpo_engine.cli_types import bounded_int, output_directory  # noqa: E402
from grpo_engine.command_failure import run_tool

RESULTS = Path(__file__).parents[1] / "results" / "kernels"
COLUMNS = ("kernel", "arch", "dtype", "variant", "block_n", "block_v", "block_k", "split_tiles", "num_warps",
           "num_stages", "hot_path", "registers", "stack_bytes", "spill_stores", "shared_bytes", "tma_loads", "wgmma",
           "mma", "ex2")
# a TMA load in the PTX: a bulk tensor copy from global into shared memory (a TMA store copies the other way)
_TMA_LOAD = re.compile(r"\bcp\.async\.bulk\.tensor\.\d+d\.shared::[\w:]+\.global\b")


def _cuobjdump() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def read_cubin(cubin: bytes) -> dict:
    """Registers, stack, static shared memory and instruction counts of one compiled kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([_cuobjdump(), "--dump-resource-usage", f.name], check=True, capture_output=True,
                               text=True).stdout
        sass = subprocess.run([_cuobjdump(), "-sass", f.name], check=True, capture_output=True, text=True).stdout
    fields = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    if "REG" not in fields:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{usage}")
    return dict(registers=int(fields["REG"]), stack_bytes=int(fields.get("STACK", 0)) + int(fields.get("LOCAL", 0)),
                static_shared=int(fields.get("SHARED", 0)),
                # a local-memory store in the SASS is a register spill
                spill_stores=len(re.findall(r"\bSTL(\.\w+)*\s", sass)),
                wgmma=len(re.findall(r"\bHGMMA\.", sass)), mma=len(re.findall(r"\bHMMA\.", sass)),
                # exponentials on the special-function units (exp2 per thread, in the code as written once)
                ex2=len(re.findall(r"\bMUFU\.EX2\b", sass)))


def compile_target(target):
    """triton's compiled kernel (its .asm holds ttir ... ptx, cubin) of one build, for its GPU."""
    import triton
    from triton.backends.compiler import GPUTarget

    fn = target.jit_function()
    signature, attrs = target.signature(fn)
    source = triton.compiler.ASTSource(fn, signature, target.all_constexprs(fn), attrs)
    return triton.compile(source, target=GPUTarget("cuda", target.capability, 32),
                          options=dict(num_warps=target.config.num_warps, num_stages=target.config.num_stages))


def compile_one(target) -> dict:
    """Compile one build and measure it (runs in a worker process)."""
    compiled = compile_target(target)
    row = target.row()
    measured = read_cubin(compiled.asm["cubin"])
    row.update(measured, shared_bytes=compiled.metadata.shared + measured.pop("static_shared"),
               tma_loads=len(_TMA_LOAD.findall(compiled.asm["ptx"])), tensor_cores=target.tensor_cores)
    return row


def run(targets, workers: int) -> list[dict]:
    if workers <= 1:
        return [compile_one(t) for t in targets]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(compile_one, targets))


# the most shared memory one program may use (opt-in maximum per block): H100 / H200 227 KB, A100 163 KB
SHARED_LIMIT = {"sm90": 232448, "sm80": 166912}


def _missing_recipe(r: dict) -> bool:
    """A Hopper tensor-core build on the hot path (the Hopper recipe's kernels) without TMA loads."""
    return r["arch"] == "sm90" and r["tensor_cores"] and r["hot_path"] and r["tma_loads"] == 0


def problems(rows: list[dict]) -> list[str]:
    """What the CI test fails on: any spill, more shared memory than the GPU has, a Hopper tensor-core build
    without wgmma, or a hot-path Hopper tensor-core build without TMA loads."""
    out = []
    for r in rows:
        where = (f"{r['kernel']} {r['arch']} {r['dtype']} {r['variant']} "
                 f"(warps {r['num_warps']}, stages {r['num_stages']})")
        if r["shared_bytes"] > SHARED_LIMIT[r["arch"]]:
            out.append(f"{where}: {r['shared_bytes']} B of shared memory, over the {SHARED_LIMIT[r['arch']]} B limit")
        if r["stack_bytes"] > 0 or r["spill_stores"] > 0:
            out.append(f"{where}: spills ({r['stack_bytes']} B stack, {r['spill_stores']} spill stores, "
                       f"{r['registers']} registers)")
        if r["arch"] == "sm90" and r["tensor_cores"] and r["wgmma"] == 0:
            out.append(f"{where}: Hopper build without wgmma ({r['mma']} mma.sync)")
        if _missing_recipe(r):
            out.append(f"{where}: hot-path Hopper build without TMA loads (cp.async.bulk.tensor)")
    return out


def report_name(triton_version: str) -> str:
    """File name (without .md / .json) of the report made with this triton."""
    return f"kernel-report-triton-{triton_version}"


def markdown(rows: list[dict], environment: dict) -> str:
    lines = [f"# Triton kernel compile report: triton {environment['triton']}", "",
             "Generated by `python -m benchmarks.model.kernel_report` on a machine without a GPU: every kernel build the "
             "launchers can choose, compiled for sm_90a (Hopper) and sm_80 (Ampere); resource usage from "
             "`cuobjdump --dump-resource-usage`, instruction counts from `cuobjdump -sass` (wgmma = HGMMA, "
             "mma = HMMA, ex2 = MUFU.EX2: the exponentials a thread issues, each loop body counted once), TMA "
             "loads from the PTX (`cp.async.bulk.tensor` global -> shared). Stack is the per-thread "
             "local memory (spilled registers); shared is dynamic + static bytes per program. hot_path: a Hopper "
             "build of the Hopper recipe (the persistent TMA forward, the token-chunk backward's dz pass, the "
             "merges), whose tensor-core builds must load through TMA and use wgmma.", "",
             "Environment: " + ", ".join(f"{k} {v}" for k, v in environment.items()), "",
             f"Builds: {len(rows)}; with spills: {sum(r['stack_bytes'] > 0 or r['spill_stores'] > 0 for r in rows)}; "
             f"Hopper tensor-core builds without wgmma: "
             f"{sum(r['arch'] == 'sm90' and r['tensor_cores'] and r['wgmma'] == 0 for r in rows)}; "
             f"over the shared-memory limit: {sum(r['shared_bytes'] > SHARED_LIMIT[r['arch']] for r in rows)}; "
             f"hot-path Hopper tensor-core builds: "
             f"{sum(r['arch'] == 'sm90' and r['tensor_cores'] and r['hot_path'] for r in rows)}, "
             f"without TMA loads: {sum(_missing_recipe(r) for r in rows)}", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(str(r[c]) for c in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def environment() -> dict:
    import torch
    import triton

    return {"triton": triton.__version__, "torch": torch.__version__}


def main(argv=None) -> int:
    parser = CommandParser(prog="python -m benchmarks.model.kernel_report", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=output_directory, default=RESULTS,
                        help="folder for kernel-report-triton-<version>.{md,json}")
    parser.add_argument("--heaviest", action="store_true",
                        help="only the variant with every register-costing flag on, per kernel, arch and dtype")
    parser.add_argument("--dtypes", nargs="+", default=None, choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--workers", type=bounded_int(1, 1024, "a worker count"), default=min(2, os.cpu_count() or 1))
    parser.add_argument("--check", action="store_true", help="exit 1 on any problem (`problems`)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("the kernel report compiles for GPUs and needs TRITON_INTERPRET=0 before triton is "
                           "imported: run it as `python -m benchmarks.model.kernel_report`")

    from grpo_kernels.kernels.compile_targets import DTYPES, all_targets

    targets = all_targets(heaviest_only=args.heaviest, dtypes=tuple(args.dtypes or DTYPES))
    started = time.perf_counter()
    rows = run(targets, args.workers)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    stem = out / report_name(env["triton"])  # "3.6.0" has dots: no Path.with_suffix
    Path(f"{stem}.json").write_text(json.dumps({"environment": env, "builds": rows}, indent=1) + "\n")
    Path(f"{stem}.md").write_text(markdown(rows, env))
    found = problems(rows)
    print(f"{len(rows)} builds in {time.perf_counter() - started:.0f} s -> {stem}.{{md,json}}")
    for line in found:
        print("PROBLEM:", line)
    return 1 if (found and args.check) else 0


if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m benchmarks.model.kernel_report"))
