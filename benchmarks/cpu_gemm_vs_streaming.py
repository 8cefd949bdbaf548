"""One CPU measurement behind the GEMM path's design (issue: "the design pays off even where there are no tensor
cores"): the loss forward + backward at N=2048, H=256, V=32768, float32, dapo, one thread, for the reference, the
chunked torch backend and the GEMM path, plus the padding and frozen-head cases of the GEMM path.

    python -m benchmarks.cpu_gemm_vs_streaming [--repeats 3]

Prints the median wall time of each; the numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss


def _problem(N: int, H: int, V: int, valid_fraction: float, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    B = 8
    T = N // B
    hidden = torch.randn(B, T, H, generator=gen)
    weight = torch.randn(V, H, generator=gen) * (3.0 / H ** 0.5)
    ids = torch.randint(0, V, (B, T), generator=gen)
    lengths = torch.full((B,), int(T * valid_fraction))
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    old = -torch.rand(B, T, generator=gen) * 5
    return hidden, weight, ids, mask, torch.randn(B, generator=gen), old


def _time(backend: str, problem, repeats: int, train_head: bool = True) -> float:
    hidden, weight, ids, mask, adv, old = problem
    config = GRPOLossConfig(loss_type="dapo", beta=0.04)
    times = []
    for _ in range(repeats):
        h = hidden.clone().requires_grad_()
        w = weight.clone().requires_grad_(train_head)
        start = time.perf_counter()
        out = fused_linear_grpo_loss(h, w, ids, mask, adv, old_logps=old, ref_logps=old, config=config,
                                     backend=backend)
        out.loss.backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    N, H, V = 2048, 256, 32768
    full = _problem(N, H, V, 1.0)
    print(f"N={N} H={H} V={V} float32 dapo beta=0.04, {args.threads} thread(s), median of {args.repeats}")
    for backend in ("reference", "torch", "gemm"):
        print(f"  {backend:9s} all valid        {1e3 * _time(backend, full, args.repeats):8.1f} ms")
    for fraction in (0.5, 0.25):
        part = _problem(N, H, V, fraction)
        print(f"  gemm      {int(fraction * 100):3d}% valid       {1e3 * _time('gemm', part, args.repeats):8.1f} ms")
    print(f"  gemm      frozen head      {1e3 * _time('gemm', full, args.repeats, train_head=False):8.1f} ms")


if __name__ == "__main__":
    main()
