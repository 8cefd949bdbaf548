"""One short check of the Triton backends on a CUDA GPU ((a) and (b) took 13 s on the second H200 run; (c) has not
run on a GPU yet):

(a) exact: at N 1024, H 1024, V 32768 (bf16, a bias) the token-level and the sequence-level loss (GSPO's ratio
    with the KL term: triton_tma's two passes, its dz tiles by the persistent kernel) and their gradients (hidden,
    weight, bias) of every backend of Triton kernels (the registry's triton_kernels entries: the deterministic
    default, the opt-in atomic backward, the Hopper recipe), and the no-grad log-probs, against the float64 reference
    (grpo_kernels.reference),
    with the test suite's bfloat16 tolerances; batch invariance (rows alone vs in the batch, bitwise) and a
    bitwise-repeatable backward for each backend that declares itself deterministic;
(b) time: no-grad log-probs and the token-level loss (dapo, beta 0.04, forward + backward) at S1 (N 8192,
    H 4096, V 151936, bf16), median of triton.testing.do_bench, beside the bare torch.mm GEMM floor (1 GEMM for
    log-probs, 3 for the loss) and the gemm backend;
(c) the Hopper recipe (triton_tma: the persistent TMA forward, token chunks) at S1-S3: no-grad log-probs against
    one torch.mm GEMM (target <= 1.15x), the token-level and sequence-level loss against three, the frozen head's
    against two (at the default workspace, and at the one where the model puts them within the Triton targets:
    benchmarks/model/triton_targets.py), each with its peak extra memory, and its loss gradients bitwise the same
    over two runs at each shape.

(d) the persistent forward's Hopper tiles and pipeline (benchmarks.triton_check.persistent_variants: the table's
    entry, a stage shorter, one-warpgroup tiles two programs an SM, a wider tile, the table's tile warp-specialized)
    timed on the no-grad log-probs at S1-S3 against one torch.mm GEMM, each variant's log-probs checked against
    the table's: which entry the table should hold, and whether a second program an SM or a warpgroup loading
    ahead hides the epilogue's exponentials (issue 35's <= 1.15x).

    python -m benchmarks.triton_check          # (a)-(c); exit status 1 if a check fails
    python -m benchmarks.triton_check --parts d
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, Optional

import torch

from grpo_engine.cli_parser import CommandParser, doc_summary
from grpo_engine.command_failure import run_tool
from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, linear_logprobs, reference
from grpo_kernels.backends import BACKENDS
from grpo_kernels.head import LMHead
from grpo_kernels.kernels.configs import GPU_CONFIGS, SIXTEEN_BIT, KernelConfig
from grpo_kernels.kernels.launch import persistent_forward

from .model.triton_targets import target_problem, workspace_within_targets

# every backend of Triton kernels, the deterministic default first
TRITON_BACKENDS = tuple(name for name, spec in BACKENDS.items() if spec.triton_kernels)

CONFIG = GRPOLossConfig(loss_type="dapo", beta=0.04)
# a sequence-level loss: the statistics first, the gradients in a second pass (triton_tma's dz tiles)
SEQUENCE_CONFIG = GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence", beta=0.04)
CONFIGS = {"token-level": CONFIG, "sequence-level": SEQUENCE_CONFIG}
# tests/support/grpo_testing.py's bfloat16 tolerances: losses relative, gradients relative to the largest entry
LOSS_TOL, GRAD_TOL, GRAD_ATOL = 1e-4, 1.5e-2, 1e-4


def _problem(B: int, T: int, H: int, V: int, seed: int = 0, logit_scale: float = 3.0, device: str = "cuda"):
    gen = torch.Generator(device=device).manual_seed(seed)
    cuda = dict(device=device, generator=gen)
    hidden = torch.randn(B, T, H, **cuda).bfloat16()
    weight = (torch.randn(V, H, **cuda) * (logit_scale / H ** 0.5)).bfloat16()
    bias = (torch.randn(V, **cuda) * 0.5).bfloat16()
    ids = torch.randint(0, V, (B, T), **cuda)
    mask = (torch.rand(B, T, **cuda) > 0.1).long()
    advantages = torch.randn(B, **cuda)
    old = -torch.rand(B, T, **cuda) * 3 - 8.0
    ref = old + 0.1 * torch.randn(B, T, **cuda)
    return hidden, weight, bias, ids, mask, advantages, old, ref


def _loss_and_grads(backend, hidden, weight, bias, ids, mask, advantages, old, ref, config=CONFIG):
    leaves = [x.detach().requires_grad_() for x in (hidden, weight, bias)]
    fn = reference.fused_linear_grpo_loss if backend == "reference" else fused_linear_grpo_loss
    kwargs = {} if backend == "reference" else dict(backend=backend)
    out = fn(leaves[0], leaves[1], ids, mask, advantages, bias=leaves[2], old_logps=old, ref_logps=ref,
             config=config, **kwargs)
    out.loss.backward()
    return out.loss.detach(), [leaf.grad for leaf in leaves]


def check_exact(B: int = 4, T: int = 256, H: int = 1024, V: int = 32768, device: str = "cuda") -> list[str]:
    """(a): the failures, as lines (the test suite runs it on CPU, interpreted, at a tiny shape)."""
    failures = []
    hidden, weight, bias, ids, mask, advantages, old, ref = _problem(B, T, H, V, device=device)
    as64 = [x.double() for x in (hidden, weight, bias)]
    for level, config in CONFIGS.items():
        expected_loss, expected_grads = _loss_and_grads("reference", *as64, ids, mask, advantages, old, ref, config)
        for backend in TRITON_BACKENDS:
            failures += _check_loss(backend, (hidden, weight, bias, ids, mask, advantages, old, ref), expected_loss,
                                    expected_grads, config, level)
    flat_hidden, flat_ids = hidden.reshape(-1, hidden.shape[-1]), ids.reshape(-1)
    with torch.no_grad():
        want_logps, want_entropy = reference.linear_logprobs(flat_hidden.double(), weight.double(), flat_ids,
                                                             bias=bias.double(), return_entropy=True)
    for backend in ("triton", "triton_tma"):
        failures += _check_logprobs(backend, flat_hidden, weight, bias, flat_ids, want_logps, want_entropy)
    return failures


def _check_logprobs(backend, flat_hidden, weight, bias, flat_ids, want_logps, want_entropy) -> list[str]:
    failures = []
    with torch.no_grad():
        logps, entropy = linear_logprobs(flat_hidden, weight, flat_ids, bias=bias, return_entropy=True,
                                         backend=backend)
        rows = sorted({0, 5 % flat_ids.numel(), 129 % flat_ids.numel(), flat_ids.numel() - 1})
        alone = [linear_logprobs(flat_hidden[r:r + 1], weight, flat_ids[r:r + 1], bias=bias, return_entropy=True,
                                 backend=backend) for r in rows]
    for name, actual, want in (("logps", logps, want_logps), ("entropy", entropy, want_entropy)):
        err = float((actual.double() - want).abs().max())
        print(f"{backend} {name}: max |error| {err:.3e}")
        if err > 10 * LOSS_TOL * max(1.0, float(want.abs().max())):
            failures.append(f"{backend} {name} error {err:.3g}")
    for r, (lp, ent) in zip(rows, alone):
        if not (torch.equal(lp, logps[r:r + 1]) and torch.equal(ent, entropy[r:r + 1])):
            failures.append(f"{backend} row {r}: log-prob or entropy alone differs bitwise from the batch's "
                            "(batch invariance)")
    return failures


def _check_loss(backend: str, problem: tuple, expected_loss, expected_grads, config: GRPOLossConfig = CONFIG,
                level: str = "token-level") -> list[str]:
    failures = []
    what = f"{backend} {level}"
    loss, grads = _loss_and_grads(backend, *problem, config)
    err = abs(float(loss) - float(expected_loss))
    print(f"loss: {what} {float(loss):.8f}, float64 {float(expected_loss):.8f}, |error| {err:.2e}")
    if err > LOSS_TOL * max(1.0, abs(float(expected_loss))):
        failures.append(f"{what}: loss error {err:.3g}")
    for name, actual, want in zip(("hidden", "weight", "bias"), grads, expected_grads):
        err, scale = float((actual.double() - want).abs().max()), float(want.abs().max())
        print(f"{what} d{name}: max |error| {err:.3e}, max |grad| {scale:.3e}")
        if err > GRAD_TOL * scale + GRAD_ATOL:
            failures.append(f"{what}: d{name} error {err:.3g} (max |grad| {scale:.3g})")
    if BACKENDS[backend].deterministic:
        _, again = _loss_and_grads(backend, *problem, config)
        if not all(torch.equal(a, b) for a, b in zip(grads, again)):
            failures.append(f"{what}: two backward runs differ bitwise")
    return failures


def _ms(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=100, rep=600, return_mode="median")


def _peak_extra_mib(run, leaves) -> float:
    """The most one run allocates beyond what was allocated before it, less the gradients it leaves, in MiB."""
    torch.cuda.synchronize()
    for leaf in leaves:
        leaf.grad = None
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    torch.cuda.synchronize()
    grads = sum(leaf.grad.numel() * leaf.grad.element_size() for leaf in leaves if leaf.grad is not None)
    return (torch.cuda.max_memory_allocated() - before - grads) / 2**20


def time_s1() -> list[tuple[str, float, float]]:
    """(b): (what, ms, x floor) rows."""
    N, H, V = 8192, 4096, 151936
    hidden, weight, _, ids, mask, advantages, old, ref = _problem(B=8, T=N // 8, H=H, V=V, seed=1)
    flat_hidden, flat_ids = hidden.reshape(N, H), ids.reshape(N)
    gemm = _ms(lambda: torch.mm(flat_hidden, weight.T))
    rows = [("torch.mm [N,H]x[H,V] (floor, 1 GEMM)", gemm, 1.0)]
    for backend in ("triton", "gemm"):
        with torch.no_grad():
            ms = _ms(lambda: linear_logprobs(flat_hidden, weight, flat_ids, backend=backend))
        rows.append((f"no-grad log-probs, {backend}", ms, ms / gemm))
    h, w = hidden.detach().requires_grad_(), weight.detach().requires_grad_()

    def step(backend):
        def run():
            h.grad = w.grad = None
            fused_linear_grpo_loss(h, w, ids, mask, advantages, old_logps=old, ref_logps=ref, config=CONFIG,
                                   backend=backend).loss.backward()
        return run

    for backend in (*TRITON_BACKENDS, "gemm"):
        ms = _ms(step(backend))
        rows.append((f"token-level loss dapo beta 0.04 fwd+bwd, {backend}", ms, ms / (3 * gemm)))
    return rows


# (c)'s shapes: benchmarks/suite/shapes.py's TARGET_SHAPES (N, H, V)
RECIPE_SHAPES = {"S1": (8192, 4096, 151936), "S2": (16384, 2048, 248320), "S3": (65536, 1536, 151936)}


def time_recipe(backend: str = "triton_tma") -> tuple[list[tuple[str, float, float]], list[str]]:
    """(c): (what, ms, x floor) rows at S1-S3, and the failures of bitwise repeatability."""
    rows, failures = [], []
    for label, (N, H, V) in RECIPE_SHAPES.items():
        hidden, weight, _, ids, mask, advantages, old, ref = _problem(B=N // 1024, T=1024, H=H, V=V, seed=2)
        flat_hidden, flat_ids = hidden.reshape(N, H), ids.reshape(N)
        gemm = _ms(lambda: torch.mm(flat_hidden, weight.T))
        rows.append((f"{label} torch.mm [N,H]x[H,V] (1 GEMM)", gemm, 1.0))
        with torch.no_grad():
            ms = _ms(lambda: linear_logprobs(flat_hidden, weight, flat_ids, backend=backend))
        rows.append((f"{label} no-grad log-probs, {backend} (target <= 1.15x)", ms, ms / gemm))
        # the default workspace, and the one where the model puts the route within the Triton targets (time
        # <= 1.6x the floor and peak extra <= 1.1x Cut Cross-Entropy's; benchmarks/model/triton_targets.py)
        # (level, frozen head, workspace): each scenario at the default workspace and at the targets' one
        cases = []
        for level, frozen, scenario in (("token-level", False, "token-level"), ("token-level", True, "frozen head"),
                                        ("sequence-level", False, "sequence-level")):
            workspace = workspace_within_targets(target_problem(label, scenario))
            cases += [(level, frozen, None)] + ([] if workspace is None else [(level, frozen, workspace)])
        for level, frozen, workspace in cases:
            h, w = hidden.detach().requires_grad_(), weight.detach().requires_grad_(not frozen)

            def run():
                h.grad = w.grad = None
                fused_linear_grpo_loss(h, w, ids, mask, advantages, old_logps=old, ref_logps=ref,
                                       config=CONFIGS[level], backend=backend,
                                       workspace_bytes=workspace).loss.backward()
            ms = _ms(run)
            floor = 2 if frozen else 3
            peak = _peak_extra_mib(run, (h, w))
            head = "frozen head" if frozen else "trained head"
            rows.append((f"{label} {level} loss, {head}, {backend}"
                         f"{'' if workspace is None else f', {workspace >> 20} MiB workspace'} (x {floor} GEMMs; "
                         f"target <= 1.6x; "
                         f"peak extra {peak:.0f} MiB beyond the gradients)", ms, ms / (floor * gemm)))
            run()
            first = [h.grad.clone()] + ([] if frozen else [w.grad.clone()])
            run()
            if not all(torch.equal(a, b) for a, b in zip(first, [h.grad] + ([] if frozen else [w.grad]))):
                failures.append(f"{backend} {label} {level} {head}: gradients differ bitwise")
        del hidden, weight, flat_hidden, h, w
        torch.cuda.empty_cache()
    return rows, failures


def persistent_variants() -> tuple[KernelConfig, ...]:
    """(d)'s Hopper entries of persistent_forward.py for 16-bit inputs, the table's first. Every build takes about
    250 registers a thread (compiled for sm_90a here: 247-252 without spills), so two programs share an SM only at
    one warpgroup a program (128 threads; 64 x 128 or 128 x 64 tiles, 75-99 KiB of shared memory at 3-4 stages):
    those run two an SM, one's epilogue exponentials beside the other's wgmma, the overlap the cost model does not
    credit (cost_model/triton_tma.py). Beside them the table's tile a stage shorter, and the 128 x 256 tile that
    spills (568 B a thread): whether its halved hidden-row reloads pay for the spills. Last, the table's tile under
    triton's Hopper warp specialisation (4 warps a warpgroup: one warpgroup issues the TMA loads ahead through the
    epilogues, two consumers fold half the rows each; compiled for sm_90a here under both tritons: setmaxnreg, 168
    registers a thread, no spills, 99 KiB of shared memory at 3 stages). Every entry splits the vocabulary every
    2048 columns, as the table's does."""
    table = GPU_CONFIGS["sm90"]["persistent"][SIXTEEN_BIT]
    split = table.block_v * table.split_tiles

    def entry(block_n, block_v, warps, stages, per_sm=1, warp_specialize=False):
        return KernelConfig(block_n, block_v, table.block_k, num_warps=warps, num_stages=stages,
                            split_tiles=split // block_v, programs_per_sm=per_sm, warp_specialize=warp_specialize)
    return (table, entry(128, 128, 8, 3), entry(64, 128, 4, 3, per_sm=2), entry(64, 128, 4, 4, per_sm=2),
            entry(128, 64, 4, 4, per_sm=2), entry(128, 256, 8, 3), entry(128, 128, 4, 4, warp_specialize=True))


def describe(config: KernelConfig) -> str:
    return (f"{config.block_n} x {config.block_v} x {config.block_k}, {config.num_warps} warps"
            f"{' a warpgroup, warp-specialized' * config.warp_specialize}, {config.num_stages} "
            f"stages, {config.programs_per_sm} program{'s' * (config.programs_per_sm > 1)} an SM")


def time_persistent_variants(shapes: dict = RECIPE_SHAPES, variants: Optional[tuple[KernelConfig, ...]] = None,
                             device: str = "cuda", timer: Callable[[Callable[[], object]], float] = None
                             ) -> tuple[list[tuple[str, float, float]], list[str]]:
    """(d): the no-grad log-probs of the persistent forward at each shape under each variant (persistent_variants()),
    (what, ms, x one torch.mm GEMM) rows; failures: a variant that does not build or run, or whose log-probs differ
    from the first variant's by more than float32 summation order explains. `timer` (default do_bench) times a
    call; the test suite runs this on CPU, interpreted, at a tiny shape, with a wall clock."""
    timer = timer or _ms
    variants = variants or persistent_variants()
    rows, failures = [], []
    for label, (N, H, V) in shapes.items():
        hidden, weight, _, ids, *_ = _problem(B=1, T=N, H=H, V=V, seed=3, device=device)
        flat_hidden, flat_ids, head = hidden.reshape(N, H), ids.reshape(N), LMHead(weight)
        gemm = timer(lambda: torch.mm(flat_hidden, weight.T))
        rows.append((f"{label} torch.mm [N,H]x[H,V] (1 GEMM)", gemm, 1.0))
        first = None
        for config in variants:
            try:
                with torch.no_grad():
                    logps = persistent_forward(flat_hidden, head, flat_ids, config=config)[0]
                    ms = timer(lambda: persistent_forward(flat_hidden, head, flat_ids, config=config))
            except Exception as error:  # a variant that does not build or fit is a result, not the end of the sweep
                failures.append(f"{label} {describe(config)}: {type(error).__name__}: {str(error)[:200]}")
                continue
            first = logps if first is None else first
            err = float((logps - first).abs().max())
            if err > LOSS_TOL * max(1.0, float(first.abs().max())):
                failures.append(f"{label} {describe(config)}: log-probs differ from the table's by {err:.3g}")
            rows.append((f"{label} no-grad log-probs, persistent {describe(config)}", ms, ms / gemm))
        del hidden, weight, flat_hidden
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows, failures


def _table(rows) -> None:
    print("| what | ms | x floor |\n|---|---:|---:|")
    for what, ms, floor in rows:
        print(f"| {what} | {ms:.2f} | {floor:.2f}x |")


def main(argv: Optional[list[str]] = None) -> int:
    parser = CommandParser(prog="python -m benchmarks.triton_check", description=doc_summary(__doc__))
    parser.add_argument("--parts", default="abc", type=_parts,
                        help="which parts to run, in order (default abc; d, the tile sweep, apart: it compiles seven "
                             "builds)")
    parts = parser.parse_args(argv).parts
    if not torch.cuda.is_available():
        print("benchmarks.triton_check needs a CUDA GPU")
        return 2
    started = time.perf_counter()
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    failures = []
    if "a" in parts:
        failures += check_exact()
        print("(a) exact:", "PASS" if not failures else "FAIL: " + "; ".join(failures))
    if "b" in parts:
        print("\n(b) S1 (N 8192, H 4096, V 151936, bf16), median ms (do_bench)\n")
        _table(time_s1())
    timed_parts = {"c": ("the Hopper recipe at S1-S3", time_recipe, "bitwise repeatable"),
                   "d": ("persistent forward tiles at S1-S3, no-grad log-probs", time_persistent_variants,
                         "every variant built and agreed")}
    for part, (title, timed, verdict) in timed_parts.items():
        if part in parts:
            print(f"\n({part}) {title}, median ms (do_bench)\n")
            rows, part_failures = timed()
            _table(rows)
            print(f"({part}) {verdict}:", "PASS" if not part_failures else "FAIL: " + "; ".join(part_failures))
            failures += part_failures
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    return 1 if failures else 0


def _parts(text: str) -> str:
    if not text or set(text) - set("abcd"):
        raise argparse.ArgumentTypeError(f"expected letters of abcd, got {text!r}")
    return text


if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m benchmarks.triton_check"))
