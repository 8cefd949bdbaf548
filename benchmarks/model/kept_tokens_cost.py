"""What replaying the sampler's kept-token sets costs: the loss forward + backward (dapo, beta = 0.04, old and
reference log-probs, GEMM path) with no set and with sets of K = 1, 20 and 1024 ids at every position.

    python -m benchmarks.model.kept_tokens_cost [--repeats 3] [--threads 1]
    python -m benchmarks.model.kept_tokens_cost --roofline    # the GPU model instead: no timing

Sets come in two kinds: `disjoint` (each position's K ids drawn independently from the whole vocabulary: the
worst case, nothing shared within a chunk) and `shared` (each sequence's positions draw from one pool of 2K ids,
as the top-p sets of one context overlap). Prints the median wall time of each; the numbers depend on the machine
and on what else runs on it.
"""

from __future__ import annotations

import sys

import dataclasses
import statistics
import time
from typing import Optional

import torch

from grpo_engine.cli_parser import CommandParser, doc_summary
from grpo_engine.cli_types import positive_int, thread_count_type
from grpo_engine.command_failure import run_tool
from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss
from grpo_kernels.backends.kept_tokens import chunk_rows

from .roofline_model import DEVICES, Estimate, Phase, Problem
from .roofline_paths import gemm as gemm_estimate

N, H, V, B = 2048, 256, 32768, 8


def kept_sets(ids: torch.Tensor, K: int, shared: bool, gen: torch.Generator) -> torch.Tensor:
    """[B, T, K] sets holding each position's target and K - 1 other distinct ids."""
    B_, T = ids.shape
    sets = torch.empty(B_, T, K, dtype=torch.int64)
    for b in range(B_):
        pool = torch.randperm(V, generator=gen)[: 2 * K] if shared else None
        for t in range(T):
            source = pool[torch.randperm(pool.numel(), generator=gen)] if shared else \
                torch.randint(0, V, (2 * K,), generator=gen)
            others = [v for v in dict.fromkeys(source.tolist()) if v != ids[b, t]][: K - 1]
            sets[b, t] = torch.tensor([int(ids[b, t]), *others])
    return sets


def kept_estimate(p: Problem, K: int, distinct_fraction: float = 1.0) -> Estimate:
    """The kept-token head's loss step (every valid row with a set of K ids): per chunk of n rows, the union of
    n K distinct_fraction ids (at most V; W itself past V/2), the W[U] copy, the logits GEMM and its recompute in
    the backward, dH and dW[U] GEMMs, the [n, |U|] float32 logits and dZ passes, the dW[U] index_add."""
    N, H, V, c = p.valid_tokens, p.hidden, p.vocab, p.itemsize
    n = chunk_rows(N, K, V)
    n = chunk_rows(N, K, V, covers_head=2 * min(V, n * K * distinct_fraction) > V)
    U = min(V, max(1, round(n * K * distinct_fraction)))
    whole = 2 * U > V
    U = V if whole else U
    chunks = -(-N // n)
    copy = [] if whole else [Phase("W[U] copy", hbm_bytes=2 * U * H * c, count=2 * chunks)]
    gemm = Phase("[n, H] x [H, |U|]", flops=2 * n * U * H, hbm_bytes=(n * H + U * H) * c + n * U * 4)
    rows = Phase("set statistics / dZ over [n, |U|]", hbm_bytes=3 * n * U * 4)
    dw = Phase("dW[U] += dZ^T h (float32 rows, index_add)", flops=2 * n * U * H,
               hbm_bytes=(n * U + n * H) * c + 3 * U * H * 4)
    phases = copy + [replace_count(gemm, 2 * chunks), replace_count(rows, 2 * chunks),
                     replace_count(Phase("dH = dZ W[U]", flops=2 * n * U * H,
                                         hbm_bytes=(n * U + U * H) * c + n * H * c), chunks),
                     replace_count(dw, chunks)]
    return Estimate("kept", p, phases, gemms=4, peak_extra_bytes=n * U * 12 + (0 if whole else U * H * c),
                    fp32_weight_grad_bytes=V * H * 4,
                    assumptions=[f"chunks of {n} rows, |U| = {U}{' (the whole head)' if whole else ''}"])


def replace_count(phase: Phase, count: int) -> Phase:
    return dataclasses.replace(phase, count=count)


def roofline_report(tokens: int = 16384, hidden: int = 3584, vocab: int = 152064) -> list[str]:
    """Modelled ms of the loss step at Qwen2.5-7B's head, bf16, with no set (the GEMM path) and with sets."""
    p = Problem(tokens=tokens, hidden=hidden, vocab=vocab)
    lines = [f"roofline model (not measured): loss step, N={tokens} H={hidden} V={vocab} bf16",
             "| sets | " + " | ".join(f"{d} ms" for d in DEVICES) + " | vs no set |", "|---|" + "---:|" * (len(DEVICES) + 1)]
    base = {d: gemm_estimate(p).seconds(r) * 1e3 for d, r in DEVICES.items()}
    lines.append("| none (gemm path) | " + " | ".join(f"{base[d]:.1f}" for d in DEVICES) + " | 1.00x |")
    for K in (1, 20, 1024):
        for label, distinct in (("disjoint", 1.0), ("shared 1/8", 0.125)):
            est = kept_estimate(p, K, distinct)
            ms = {d: est.seconds(r) * 1e3 for d, r in DEVICES.items()}
            first = next(iter(DEVICES))
            lines.append(f"| K={K} {label} | " + " | ".join(f"{ms[d]:.1f}" for d in DEVICES)
                         + f" | {ms[first] / base[first]:.2f}x |")
    return lines


def _time(problem, kept: Optional[torch.Tensor], repeats: int) -> float:
    hidden, weight, ids, mask, adv, old = problem
    config = GRPOLossConfig(loss_type="dapo", beta=0.04)
    times = []
    for _ in range(repeats):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        start = time.perf_counter()
        out = fused_linear_grpo_loss(h, w, ids, mask, adv, old_logps=old, ref_logps=old, config=config,
                                     backend="gemm", kept_token_ids=kept)
        out.loss.backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: Optional[list[str]] = None) -> None:
    parser = CommandParser(prog="python -m benchmarks.model.kept_tokens_cost",
                           description=doc_summary(__doc__, first_line=True))
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--threads", type=thread_count_type(), default=1)
    parser.add_argument("--sizes", type=positive_int, nargs="+", default=[1, 20, 1024])
    parser.add_argument("--roofline", action="store_true", help="print the GPU roofline model instead of timing")
    args = parser.parse_args(argv)
    if args.roofline:
        print("\n".join(roofline_report()))
        return
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    T = N // B
    problem = (torch.randn(B, T, H, generator=gen), torch.randn(V, H, generator=gen) * (3.0 / H ** 0.5),
               torch.randint(0, V, (B, T), generator=gen), torch.ones(B, T), torch.randn(B, generator=gen),
               -torch.rand(B, T, generator=gen) * 5)
    print(f"N={N} H={H} V={V} float32 dapo beta=0.04, gemm backend, {args.threads} thread(s), "
          f"median of {args.repeats}")
    base = _time(problem, None, args.repeats)
    print(f"  no set                 {1e3 * base:8.1f} ms")
    for K in args.sizes:
        for shared in (False, True):
            kept = kept_sets(problem[2], K, shared, gen)
            ms = 1e3 * _time(problem, kept, args.repeats)
            print(f"  K={K:<5d} {'shared' if shared else 'disjoint':8s}      {ms:8.1f} ms  ({ms / (1e3 * base):.2f}x)")


if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m benchmarks.model.kept_tokens_cost"))
