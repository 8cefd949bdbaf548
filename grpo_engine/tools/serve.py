"""`grpo-engine serve`: a vLLM server with the settings the vllm_server rollout backend needs.

It runs vLLM's own OpenAI-compatible server (`python -m vllm.entrypoints.openai.api_server`, which works where the
`vllm` console script does not, as in the CPU build's community wheel) with: the sampler's processed log-probs
(`--logprobs-mode processed_logprobs`: what the trainer compares its own with), the dtype and longest sequence
asked for, VLLM_SERVER_DEV_MODE=1 (the reload_weights and reset_prefix_cache endpoints the CPU weight push calls),
on CUDA vLLM's NCCL weight-transfer engine (`--weight-transfer-config`), on a CPU eager mode. With `--lora-rank R`
(a run with model.lora.enabled, whose adapters the trainer loads at runtime): `--enable-lora`, `--max-lora-rank`
the smallest of vLLM's ranks at least R, `--max-loras 2` (the adapter served and the next one, loaded before the
old is unloaded) and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (the load / unload endpoints). Arguments after `--` go
to vLLM unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from ..cli_parser import CommandParser
from ..cli_types import port_number, positive_int
from ..launch_env import listen_problem


# The values vLLM 0.32 accepts for --max-lora-rank (vllm.config.lora.MaxLoRARanks; a vLLM test checks the copy).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def max_lora_rank(rank: int) -> int:
    """vLLM's smallest --max-lora-rank that holds adapters of `rank`."""
    fitting = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fitting:
        raise ValueError(f"--lora-rank {rank}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}")
    return fitting[0]


def lora_rank(text: str) -> int:
    try:
        rank = int(text)
        max_lora_rank(rank)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected the adapters' rank (model.lora.r), 1 to {VLLM_LORA_RANKS[-1]}: "
                                         f"{exc}") from None
    if rank < 1:
        raise argparse.ArgumentTypeError(f"expected the adapters' rank (model.lora.r), at least 1, got {rank}")
    return rank


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="the model directory (or Hub id) the run trains")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=port_number, default=8000)
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                        help="as model.dtype (auto: bf16 on CUDA, fp32 on a CPU)")
    parser.add_argument("--max-model-len", type=positive_int, default=None,
                        help="the longest prompt + completion (data.max_prompt_length + rollout.max_new_tokens)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--lora-rank", type=lora_rank, default=None,
                        help="model.lora.r of a LoRA run: the server takes its adapters at runtime (--enable-lora, "
                             "--max-lora-rank, --max-loras 2, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)")
    parser.add_argument("--python", default=sys.executable,
                        help="the Python of vLLM's environment (default: this one)")
    parser.add_argument("--print-command", action="store_true", help="print the command and exit")
    parser.add_argument("vllm_args", nargs=argparse.REMAINDER, help="-- then vLLM's own arguments")


def serve_command(args: argparse.Namespace, cuda: bool) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) of the vLLM server."""
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if cuda else "float32")
    argv = [args.python, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model, "--host", args.host,
            "--port", str(args.port), "--dtype", dtype, "--logprobs-mode", "processed_logprobs"]
    if args.max_model_len is not None:
        argv += ["--max-model-len", str(args.max_model_len)]
    if cuda:
        argv += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    else:
        argv += ["--enforce-eager"]
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    if getattr(args, "lora_rank", None) is not None:
        argv += ["--enable-lora", "--max-lora-rank", str(max_lora_rank(args.lora_rank)), "--max-loras", "2"]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    extra = [a for a in args.vllm_args if a != "--"]
    return argv + extra, env


def check_server_inputs(model: str, python: str) -> None:
    """ConfigError in one line when --model is neither a local directory nor a Hub id, or --python is not a program
    this process may run: vLLM found a mistyped model path after its start-up, in a traceback of its own, and a
    --python that is not there was "FileNotFoundError: [Errno 2]", naming no option. (--print-command checks
    neither: the command may be for another machine.)"""
    from ..config import ConfigError, is_hub_id

    if not model.strip() or not (Path(model).expanduser().is_dir() or is_hub_id(model)):  # "" is the cwd
        raise ConfigError(f"--model {model[:80]!r}: expected a local model directory or a Hub id ORG/NAME")
    if not (Path(python).is_file() and os.access(python, os.X_OK)):
        what = "not there" if not Path(python).exists() else "not an executable file"
        raise ConfigError(f"--python {python[:80]!r}: expected the Python program of vLLM's environment; it is {what}")


def serve(args: argparse.Namespace) -> int:
    if args.device == "auto":
        import torch

        cuda = torch.cuda.is_available()
    else:
        cuda = args.device == "cuda"
    argv, env = serve_command(args, cuda)
    if args.print_command:
        print(" ".join(f"{k}={v}" for k, v in env.items()), " ".join(argv))
        return 0
    check_server_inputs(args.model, args.python)  # before vLLM starts (tens of seconds) to find them missing
    problem = listen_problem(args.host, args.port)  # before vLLM loads the model, which then failed to bind
    if problem is not None:
        raise OSError(f"serve cannot listen on {args.host}:{args.port} ({problem}): another server or program holds "
                      f"it, or --host is not this machine's address; choose another --port or --host")
    os.execve(argv[0], argv, {**os.environ, **env})  # the server replaces this process: signals reach it


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = CommandParser(prog="grpo-engine serve")
    add_serve_arguments(parser)
    return serve(parser.parse_args(argv))
