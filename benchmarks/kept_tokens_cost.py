"""What replaying the sampler's kept-token sets costs: the loss forward + backward (dapo, beta = 0.04, old and
reference log-probs, GEMM path) with no set and with sets of K = 1, 20 and 1024 ids at every position.

    python -m benchmarks.kept_tokens_cost [--repeats 3] [--threads 1]

Sets come in two kinds: `disjoint` (each position's K ids drawn independently from the whole vocabulary: the
worst case, nothing shared within a chunk) and `shared` (each sequence's positions draw from one pool of 2K ids,
as the top-p sets of one context overlap). Prints the median wall time of each; the numbers depend on the machine
and on what else runs on it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Optional

import torch

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss

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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 20, 1024])
    args = parser.parse_args(argv)
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
    main()
