"""`grpo-engine bench`: what the fused loss buys one GRPO optimizer step of a real architecture.

One step is what the trainer does after generation: old and reference log-probs (`linear_logprobs`, no
grad) and one AdamW update through `fused_linear_grpo_loss` (dapo, beta 0.04, so the KL term runs too), on
random completions of length T for a model built in code from a real config with random weights (no
download). Per loss backend it reports the step time, the peak memory, and the longest completion length
T that fits a memory budget.

Every measurement runs in its own process (forked on CPU, spawned on CUDA), so a backend's peak is its own
and a probe that runs out of memory cannot take the others down:
- CUDA: `torch.cuda.max_memory_allocated()` over the process (weights, optimizer state and the step).
- CPU: the process's peak resident set size (VmHWM), which includes the torch runtime inherited at fork
  (the same for every backend).
The length search doubles T from `--start-length` until a probe exceeds the budget (or `--max-length`),
then bisects between the last fit and the first miss down to `--resolution` tokens; every probe is a real
step in a fresh process, not an estimate.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig

from grpo_kernels import GRPOLossConfig
from grpo_kernels.backends import BASELINE_BACKEND, backend_names, get_backend

from .bench_memory import device_memory, gib, least_step_bytes, weight_count
from .bench_options import ARCHITECTURES, build_parser
from .measuring_child import call_in_child
from ..command_failure import run_tool

TINY_LAYERS = 2
TINY_HEAD_DIM = 8


def fused_backends() -> tuple[str, ...]:
    """The fused backends to compare with the baseline (which forms the [tokens, vocab] logits), as registered now;
    "auto" only picks one of them."""
    return tuple(b for b in backend_names(with_auto=False) if not get_backend(b).materializes_logits)


def architecture_config(name: str, scale: str) -> PretrainedConfig:
    """The named architecture; scale "tiny" keeps its vocabulary and head counts with 2 layers and 8-wide
    heads, so the LM head (what the fused loss is about) keeps its real size while the decoder shrinks."""
    if name not in ARCHITECTURES:
        raise ValueError(f"model: unknown architecture {name!r}; choose from {sorted(ARCHITECTURES)}")
    if scale not in ("full", "tiny"):
        raise ValueError(f"scale must be 'full' or 'tiny', got {scale!r}")
    config = ARCHITECTURES[name]()
    if scale == "tiny":
        ratio = config.intermediate_size / config.hidden_size
        config.hidden_size = config.num_attention_heads * TINY_HEAD_DIM
        config.intermediate_size = int(config.hidden_size * ratio)
        config.num_hidden_layers = TINY_LAYERS
        config.head_dim = TINY_HEAD_DIM
    return config


@dataclass(frozen=True)
class StepSpec:
    model: str
    scale: str
    backend: str
    batch_size: int  # completions per step (one micro-batch)
    prompt_length: int
    completion_length: int
    dtype: str  # "auto": bf16 on CUDA, fp32 on CPU
    lora: bool  # LoRA adapters (the reference is the base model, no second copy)
    device: str
    seed: int = 0

    @property
    def tokens(self) -> int:
        return self.batch_size * (self.prompt_length + self.completion_length)


@dataclass
class StepResult:
    spec: StepSpec
    fits: bool
    error: Optional[str]  # out of memory, or another failure
    step_s: Optional[float]  # median of the timed steps
    peak_bytes: Optional[int]


def build_step(spec: StepSpec) -> Callable[[], None]:
    """The model, reference, optimizer and a random batch of `spec`; returns a closure running one step."""
    from accelerate import Accelerator

    from ..config import LoraConfig
    from ..steps.logprobs import reference_logprobs, sequence_logprobs
    from ..model.loading import HiddenStatePolicy, add_lora, frozen_copy, resolve_dtype
    from ..rollout.base import RolloutBatch
    from ..model.master_weights import trained_weights_adamw
    from ..steps.update import UpdateInputs, policy_update

    device = torch.device(spec.device)
    torch.manual_seed(spec.seed)
    config = architecture_config(spec.model, spec.scale)
    dtype = resolve_dtype(spec.dtype, device)
    lm = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa").to(device)
    reference = None
    if spec.lora:
        lm = add_lora(lm, LoraConfig(enabled=True, dropout=0.0))
    else:
        reference = HiddenStatePolicy(frozen_copy(lm))
    policy = HiddenStatePolicy(lm).train()
    optimizer = trained_weights_adamw("auto", [p for p in policy.parameters() if p.requires_grad], lr=1e-6)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    accelerator = Accelerator(cpu=device.type == "cpu")

    B, P, T = spec.batch_size, spec.prompt_length, spec.completion_length
    ones = lambda *shape: torch.ones(*shape, dtype=torch.long, device=device)  # noqa: E731
    ids = lambda length: torch.randint(0, config.vocab_size, (B, length), device=device)  # noqa: E731
    batch = RolloutBatch([""] * B, [""] * B, ids(P), ones(B, P), ids(T), ones(B, T), ones(B, T),
                         torch.zeros(B, dtype=torch.bool, device=device))
    advantages = torch.randn(B, device=device)
    loss_config = GRPOLossConfig(beta=0.04)  # TRL's default loss type

    def step() -> None:
        old = sequence_logprobs(policy, batch, 1.0, B, spec.backend)
        ref = reference_logprobs(policy, reference, batch, 1.0, B, spec.backend)
        inputs = UpdateInputs(batch, advantages, old, ref, float(B * T))
        policy_update(accelerator, policy, lm, optimizer, scheduler, inputs, loss_config, B, 1, 1.0,
                      spec.backend, step=0)
        if device.type == "cuda":
            torch.cuda.synchronize()

    return step


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmHWM not found in /proc/self/status")


def _is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in str(exc).lower()


def _measure(spec: StepSpec, repeats: int, threads: Optional[int]) -> dict[str, Any]:
    """In the forked child: build, run the step `repeats` times (0: once, untimed), report time and peak."""
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        step = build_step(spec)
        times = []
        for _ in range(max(1, repeats + (1 if repeats else 0))):  # timed runs follow one warm-up step
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        peak = torch.cuda.max_memory_allocated() if spec.device == "cuda" else _peak_rss_bytes()
        return {"error": None, "step_s": statistics.median(times[1:]) if repeats else None, "peak_bytes": peak}
    except Exception as exc:  # reported to the parent: an out-of-memory probe is a result, not a crash
        if not _is_out_of_memory(exc):
            raise
        return {"error": f"out of memory: {str(exc).splitlines()[0]}", "step_s": None, "peak_bytes": None}


def run_in_fresh_process(spec: StepSpec, repeats: int, budget_bytes: Optional[int],
                         threads: Optional[int] = None) -> StepResult:
    """One measurement in a fresh process: forked on CPU (no re-import), spawned on CUDA (a forked child
    cannot use CUDA once the parent has queried it). A child that dies (the kernel's out-of-memory killer, a
    signal, a crash in native code) is a failed measurement, said as one: multiprocessing.Pool waited forever for it.
    The child ends with the bench, however the bench ends (measuring_child.py)."""
    context = multiprocessing.get_context("spawn" if spec.device == "cuda" else "fork")
    out = call_in_child(context, _measure, spec, repeats, threads)
    if out is None:
        out = {"error": f"the measuring process died (killed, or a crash in native code; e.g. the system's "
                        f"out-of-memory killer at {spec.completion_length}-token completions)",
               "step_s": None, "peak_bytes": None}
    fits = out["error"] is None and (budget_bytes is None or out["peak_bytes"] <= budget_bytes)
    return StepResult(spec, fits, out["error"], out["step_s"], out["peak_bytes"])


def longest_fitting_length(spec: StepSpec, budget_bytes: int, start: int, limit: int, resolution: int,
                           threads: Optional[int] = None,
                           certain_miss: Callable[[int], bool] = lambda length: False) -> tuple[Optional[int], int]:
    """(longest completion length that fits the budget or None, number of probes): doubling from `start`
    (the last doubling clipped to `limit`), then bisection to `resolution` tokens. `limit` itself fitting
    returns `limit`: the longest that fits is at least that. A length `certain_miss` says cannot fit (its least
    memory is over the budget or the device) is a miss without a process."""
    def fits(length: int) -> bool:
        if certain_miss(length):
            return False
        probe = replace(spec, completion_length=length)
        return run_in_fresh_process(probe, 0, budget_bytes, threads).fits

    probes, low, high = 0, None, None
    length = start
    while True:
        probes += 1
        if not fits(length):
            high = length
            break
        low = length
        if length >= limit:
            break
        length = min(length * 2, limit)
    if low is None or high is None:  # the start does not fit, or the limit does
        return low, probes
    while high - low > resolution:
        middle = (low + high) // 2
        probes += 1
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low, probes


def default_backends(device: str) -> list[str]:
    # Triton kernels run under their interpreter on CPU: far too slow at a real vocab.
    fused = [b for b in fused_backends() if not (device == "cpu" and get_backend(b).triton_kernels)]
    return [BASELINE_BACKEND, *fused]


def format_report(rows: Sequence[dict[str, Any]], header: str) -> str:
    lines = [header, "", "| backend | step s | peak memory MiB | longest completion that fits | probes |",
             "|---|---:|---:|---:|---:|"]
    for row in rows:
        result: StepResult = row["step"]
        step_s = f"{result.step_s:.3f}" if result.step_s is not None else "-"
        peak = f"{result.peak_bytes / 2**20:.0f}" if result.peak_bytes is not None else result.error
        longest = row.get("longest")
        longest_text = "-" if "longest" not in row else ("none" if longest is None else str(longest))
        if row.get("limit_fits"):
            longest_text = f">= {longest} (--max-length)"
        lines.append(f"| {result.spec.backend} | {step_s} | {peak} | {longest_text} | {row.get('probes', '-')} |")
    return "\n".join(lines)


def _positive_ints(args: argparse.Namespace, names: Sequence[str]) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def least_bytes_of(args: argparse.Namespace, device: str) -> Callable[[str, int], int]:
    """(backend, completion length) -> the least memory of a step of `args` (bench_memory.least_step_bytes)."""
    from ..model.loading import resolve_dtype

    config = architecture_config(args.model, args.scale)
    weights = weight_count(config)
    element = torch.empty((), dtype=resolve_dtype(args.dtype, torch.device(device))).element_size()
    return lambda backend, length: least_step_bytes(config, weights, args.batch_size, args.prompt_length, length,
                                                    element, args.lora, get_backend(backend).materializes_logits)


def check_fits_device(args: argparse.Namespace, backend: str, need: int, memory: Optional[tuple[int, str]]) -> None:
    """ValueError naming the size options when a step needs more than the device has."""
    if memory is None or need <= memory[0]:
        return
    smaller = "smaller sizes" + (" or --scale tiny" if args.scale == "full" else "")
    raise ValueError(f"--model {args.model} (--scale {args.scale}{', --lora' if args.lora else ''}) with --batch-size "
                     f"{args.batch_size} x (--prompt-length {args.prompt_length} + --completion-length "
                     f"{args.completion_length}) tokens needs at least {gib(need)} for one step of the {backend} "
                     f"backend, more than this machine's {gib(memory[0])} of {memory[1]}: choose {smaller}")


def run_bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    _positive_ints(args, ["batch_size", "prompt_length", "completion_length", "repeats", "threads",
                          "start_length", "max_length", "resolution"])
    if args.start_length > args.max_length:
        raise ValueError(f"--start-length ({args.start_length}) must not exceed --max-length ({args.max_length})")
    if args.budget_gb is not None and args.budget_gb <= 0:
        raise ValueError(f"--budget-gb must be > 0, got {args.budget_gb}")
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = "cpu" if device == "auto" else device
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    backends = args.backends or default_backends(device)
    names = backend_names()
    unknown = [b for b in backends if b not in names]
    if unknown:
        raise ValueError(f"--backends: unknown {unknown}; this grpo_kernels has {list(names)}")
    twice = sorted({b for b in backends if backends.count(b) > 1})
    if twice:
        raise ValueError(f"--backends: {twice} named more than once; name each backend once")
    interpreted = [b for b in backends if get_backend(b).triton_kernels and device == "cpu"]
    if interpreted:
        raise ValueError(f"--backends: {interpreted} run Triton kernels, which need --device cuda (on a CPU the "
                         "Triton interpreter runs them: hours a step at a real vocabulary)")
    least = least_bytes_of(args, device)  # a bad architecture name fails here, not in every child
    budget = None if args.budget_gb is None else int(args.budget_gb * 2**30)
    memory = device_memory(device)
    for backend in backends:  # every step fits the device before the first is measured
        check_fits_device(args, backend, least(backend, args.completion_length), memory)
    rows = []
    for backend in backends:
        spec = StepSpec(args.model, args.scale, backend, args.batch_size, args.prompt_length,
                        args.completion_length, args.dtype, args.lora, device)
        row: dict[str, Any] = {"step": run_in_fresh_process(spec, args.repeats, None, args.threads)}
        if budget is not None:
            room = min(budget, memory[0]) if memory is not None else budget
            row["longest"], row["probes"] = longest_fitting_length(
                spec, budget, args.start_length, args.max_length, args.resolution, args.threads,
                certain_miss=lambda length, backend=backend: least(backend, length) > room)
            row["limit_fits"] = row["longest"] == args.max_length
        rows.append(row)
    return rows


def report_header(args: argparse.Namespace, rows: Sequence[dict[str, Any]]) -> str:
    spec: StepSpec = rows[0]["step"].spec
    memory = "max_memory_allocated" if spec.device == "cuda" else "peak RSS of the measuring process"
    budget = f"; longest completion within {args.budget_gb:g} GiB" if args.budget_gb is not None else ""
    return (f"{spec.model} ({spec.scale}{', LoRA' if spec.lora else ''}) on {spec.device}: one GRPO step "
            f"(old + ref log-probs, dapo beta 0.04 update), {spec.batch_size} completions x "
            f"({spec.prompt_length} prompt + {spec.completion_length} completion) tokens, dtype {spec.dtype}; "
            f"memory: {memory}{budget}")


def bench_and_print(args: argparse.Namespace) -> int:
    rows = run_bench(args)
    print(format_report(rows, report_header(args, rows)))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return bench_and_print(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m grpo_engine.tools.bench"))
