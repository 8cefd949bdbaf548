"""One CPU measurement behind the GEMM path's design (issue: "the design pays off even where there are no tensor
cores"): the loss forward + backward at N=2048, H=256, V=32768, float32, dapo with beta=0.04 and old/ref log-probs,
one thread, for the reference, the chunked torch backend, the GEMM path and TRL 1.16's GRPOTrainer (its fused LM
head and its own per-token loss, benchmarks/suite/trl_path.py; left out when TRL is not installed), plus the padding and
frozen-head cases of the GEMM path.

    python -m benchmarks.suite.cpu_gemm_vs_streaming [--repeats 3]

Prints the median wall time of each over interleaved rounds (every row once per round, so a change in the
machine's load hits all rows alike); the numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import sys

import statistics
import time
from typing import Callable, Optional

import torch

from grpo_engine.cli_parser import CommandParser, doc_summary
from grpo_engine.cli_types import positive_int, thread_count_type
from grpo_engine.command_failure import run_tool
from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss

from .paths import PathUnavailable, require_trl

CONFIG = GRPOLossConfig(loss_type="dapo", beta=0.04)


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


def _step(path: str, problem, train_head: bool = True) -> Callable[[], object]:
    """Loss forward + backward on fresh leaves (old log-probs also stand in for the reference's)."""
    hidden, weight, ids, mask, adv, old = problem
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_(train_head)
    leaves = (h, w) if train_head else (h,)
    if path == "trl":
        from . import trl_path

        return trl_path.loss_step(h, w, ids, mask, adv, CONFIG, old_logps=old, ref_logps=old, leaves=leaves)

    def step():
        out = fused_linear_grpo_loss(h, w, ids, mask, adv, old_logps=old, ref_logps=old, config=CONFIG,
                                     backend=path)
        return torch.autograd.grad(out.loss, leaves)
    return step


def _median_seconds(steps: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: Optional[list[str]] = None) -> None:
    parser = CommandParser(prog="python -m benchmarks.suite.cpu_gemm_vs_streaming",
                           description=doc_summary(__doc__, first_line=True))
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--threads", type=thread_count_type(), default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    N, H, V = 2048, 256, 32768
    full = _problem(N, H, V, 1.0)
    paths = ["reference", "torch", "gemm", "trl"]
    try:
        require_trl()
    except PathUnavailable as reason:
        print(f"trl left out: {reason}")
        paths.remove("trl")
    steps = {f"{path:9s} all valid      ": _step(path, full) for path in paths}
    for fraction in (0.5, 0.25):
        steps[f"gemm      {int(fraction * 100):3d}% valid     "] = _step("gemm", _problem(N, H, V, fraction))
    steps["gemm      frozen head    "] = _step("gemm", full, train_head=False)
    print(f"N={N} H={H} V={V} float32 dapo beta=0.04, {args.threads} thread(s), "
          f"median of {args.repeats} interleaved rounds")
    for name, seconds in _median_seconds(steps, args.repeats).items():
        print(f"  {name}  {1e3 * seconds:8.1f} ms")


if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m benchmarks.suite.cpu_gemm_vs_streaming"))
