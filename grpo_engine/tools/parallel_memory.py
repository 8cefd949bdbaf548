"""Per-process peak memory of the same training run under DDP and under FSDP (`model.fsdp`), on CPU processes.

    python -m grpo_engine.tools.parallel_memory [--scale demo|wide] [--processes 2] [--steps 3] [--mmap-threshold BYTES]

Each mode is a real `grpo-engine train` under `torchrun --nproc_per_node P` (gloo); every process reports its
peak resident set (VmHWM: the torch runtime, the model loaded whole before sharding, the final checkpoint
included). `demo` is the built-in demo (its preset, no warm start); `wide` a 50 M-parameter Qwen2 (hidden 768,
8 layers) with the demo's tokenizer and task, written to a temporary directory with random weights, where the
weights, gradients and AdamW state outweigh the runtime. The "model state" column is modelled, not measured:
weights + gradients + AdamW's two moments, 16 bytes per fp32 parameter, divided by P under FSDP.

Both modes run with glibc's mmap threshold fixed (MALLOC_MMAP_THRESHOLD_, 1 MiB unless --mmap-threshold says
otherwise; 0 leaves glibc's default). By default glibc raises the threshold to the size of the largest block
freed (up to 32 MiB), after which FSDP's per-layer gather and reduce-scatter buffers, allocated and freed at
every forward and backward, come from the heap, which keeps the pages: the resident set then measures the
allocator rather than what the run holds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from ..cli_parser import CommandParser, doc_summary
from ..cli_types import bounded_int, positive_int
from ..command_failure import run_tool
from ..state.metrics import peak_memory_mb

MODES = {"ddp": [], "fsdp": ["--model.fsdp", "true"]}
COMMON_FLAGS = ["--run.warm_start_steps", "0", "--run.progress_bar", "false", "--run.plot", "false",
                "--run.log_completions_steps", "0"]
# The wide model has no preset: the demo's task and sampling, a smaller batch (a 50 M model on a CPU core).
WIDE_FLAGS = ["--data.builtin_max_operand", "5", "--rollout.num_generations", "8", "--rollout.max_new_tokens", "12",
              "--rollout.temperature", "0.85", "--optim.per_device_train_batch_size", "8",
              "--optim.learning_rate", "1e-4", "--run.num_threads", "1"]


def write_wide_model(directory: Path) -> int:
    """A Qwen2 of about 50 M parameters with the demo's character tokenizer; returns its parameter count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from ..data.demo_task import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
                         num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=128,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def demo_parameters() -> int:
    from ..data.demo_task import build_char_tokenizer, build_tiny_model

    return sum(p.numel() for p in build_tiny_model(build_char_tokenizer(), seed=0).parameters())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_mode(mode: str, processes: int, train_flags: list[str], work: Path, mmap_threshold: int) -> list[float]:
    """Each process's peak RSS (MiB) of `grpo-engine train` in this mode."""
    report = work / f"{mode}-report"
    report.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
               "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "-m", "grpo_engine.tools.parallel_memory",
               "--report", str(report), "--", "--run.output_dir", str(work / mode), *train_flags, *MODES[mode]]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if mmap_threshold:
        env["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold)
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"the {mode} run failed (exit status {result.returncode}):\n{result.stderr[-3000:]}")
    return [json.loads((report / f"rank-{rank}.json").read_text())["peak_rss_mb"] for rank in range(processes)]


def report_worker(report: Path, train_args: list[str]) -> int:
    """One torchrun process: train, then write this process's peak RSS (also when training fails)."""
    from ..cli import main as engine_main

    status = 1
    try:
        status = engine_main(["train", *train_args]) or 0
    finally:
        rank = os.environ.get("RANK", "0")
        (report / f"rank-{rank}.json").write_text(json.dumps({"peak_rss_mb": peak_memory_mb_cpu()}))
    return status


def peak_memory_mb_cpu() -> float:
    import torch

    return peak_memory_mb(torch.device("cpu"))


# What one process holds once torch is imported, before any model: a floor (a demo rank measured 540 MiB).
PROCESS_FLOOR_BYTES = 256 * 2**20


def check_processes_fit(parser: CommandParser, processes: int) -> None:
    """--processes whose torch runtimes alone are over the machine's memory, refused before torchrun starts them
    (`--processes 100000` started torchrun on 100000 processes)."""
    from .bench_memory import device_memory, gib

    memory = device_memory("cpu")
    need = processes * PROCESS_FLOOR_BYTES
    if memory is not None and need > memory[0]:
        parser.error(f"argument --processes: {processes} processes hold at least {gib(need)} (torch's runtime, "
                     f"{PROCESS_FLOOR_BYTES >> 20} MiB each), more than this machine's {gib(memory[0])} of {memory[1]}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = CommandParser(prog="python -m grpo_engine.tools.parallel_memory",
                                     description=doc_summary(__doc__))
    parser.add_argument("--scale", choices=["demo", "wide"], default="demo",
                        help="demo: the built-in 0.1 M-parameter model; wide: a 50 M-parameter one (default: demo)")
    parser.add_argument("--processes", type=bounded_int(2, what="a number of processes"), default=2,
                        help="torchrun processes per mode, at least 2: FSDP shards over them (default: 2)")
    parser.add_argument("--steps", type=positive_int, default=3, help="training steps per run (default: 3)")
    parser.add_argument("--mmap-threshold", type=bounded_int(0, what="a number of bytes"), default=2**20,
                        help="glibc's MALLOC_MMAP_THRESHOLD_ for both runs, in bytes; 0: glibc's default "
                             "(default: 1048576)")
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)  # a torchrun worker: where to write
    args, rest = parser.parse_known_args(argv)
    rest = [a for a in rest if a != "--"]
    if args.report is not None:
        return report_worker(args.report, rest)
    if rest:  # only a torchrun worker takes train flags (from run_mode); here they were dropped without a word
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    check_processes_fit(parser, args.processes)
    with tempfile.TemporaryDirectory(prefix="parallel-memory-") as tmp:
        work = Path(tmp)
        flags = [*COMMON_FLAGS, "--run.max_steps", str(args.steps)]
        if args.scale == "wide":
            parameters = write_wide_model(work / "model")
            flags += ["--model", str(work / "model"), *WIDE_FLAGS]
        else:
            parameters = demo_parameters()
        whole = parameters * 16 / 2**20
        threshold = f"{args.mmap_threshold} bytes" if args.mmap_threshold else "glibc's default"
        print(f"scale {args.scale}: {parameters / 1e6:.2f} M parameters (fp32), {args.processes} CPU processes, "
              f"{args.steps} steps, MALLOC_MMAP_THRESHOLD_ {threshold}")
        print(f"{'mode':<6}{'model state (modelled)':>24}   peak RSS per process (measured)")
        for mode in MODES:
            peaks = run_mode(mode, args.processes, flags, work, args.mmap_threshold)
            state = whole if mode == "ddp" else whole / args.processes
            print(f"{mode:<6}{state:>20.1f} MiB   " + "  ".join(f"rank {r}: {p:.0f} MiB" for r, p in enumerate(peaks)))
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m grpo_engine.tools.parallel_memory"))
