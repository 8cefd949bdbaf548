"""The architectures and the command line of `grpo-engine bench`, without importing torch or transformers
(each architecture's config class is imported when it is built), so `grpo-engine bench --help` is instant."""

from __future__ import annotations

import argparse
from typing import Any, Callable, Optional

from ..cli_parser import CommandParser
from ..cli_types import positive_float, positive_int, thread_count_type

DESCRIPTION = "what the fused loss buys one GRPO optimizer step of a real architecture"
# --budget-gb's ceiling: far past any device's memory, and its bytes a count every allocator takes (1e308 GiB
# overflowed the int of bytes: "cannot convert float infinity to integer")
MAX_BUDGET_GIB = 1e6


def _qwen25(vocab: int, hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int,
            tied: bool) -> Callable[[], Any]:
    def build() -> Any:
        from transformers import Qwen2Config

        return Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                           num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                           rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=tied)

    return build


def _llama3_8b() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, rope_theta=5e5, rms_norm_eps=1e-5,
                       tie_word_embeddings=False)


# Architectures of the released checkpoints (their config.json values), built with transformers' classes.
ARCHITECTURES: dict[str, Callable[[], Any]] = {
    "qwen2.5-0.5b": _qwen25(151936, 896, 4864, layers=24, heads=14, kv_heads=2, tied=True),
    "qwen2.5-1.5b": _qwen25(151936, 1536, 8960, layers=28, heads=12, kv_heads=2, tied=True),
    "qwen2.5-7b": _qwen25(152064, 3584, 18944, layers=28, heads=28, kv_heads=4, tied=False),
    "llama-3-8b": _llama3_8b,
}


def build_parser(parser: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    parser = parser or CommandParser(prog="grpo-engine bench", description=DESCRIPTION)
    add = parser.add_argument
    add("--model", default="qwen2.5-0.5b", choices=sorted(ARCHITECTURES),
        help="architecture (a released model's config with random weights; no download) (default: %(default)s)")
    add("--scale", default="full", choices=["full", "tiny"],
        help="tiny: the real vocabulary with a 2-layer, 8-wide-head decoder (CPU-sized) (default: %(default)s)")
    from grpo_kernels.backends import BACKENDS, BASELINE_BACKEND  # the registry: no torch import

    fused = [name for name, spec in BACKENDS.items() if not spec.materializes_logits]
    on_cuda = [name for name in fused if BACKENDS[name].triton_kernels]
    add("--backends", nargs="+", metavar="BACKEND",
        help=f"loss backends to compare (default: {BASELINE_BACKEND}, then every fused backend: "
             f"{', '.join(fused)}; {', '.join(on_cuda)} on CUDA only)")
    add("--batch-size", type=positive_int, default=8, help="completions per step (default: %(default)s)")
    add("--prompt-length", type=positive_int, default=128,
        help="prompt tokens of each completion (default: %(default)s)")
    add("--completion-length", type=positive_int, default=1024,
        help="completion tokens T of the timed step (default: %(default)s)")
    add("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
        help="weights and activations (auto: bfloat16 on CUDA, float32 on CPU) (default: %(default)s)")
    add("--lora", action="store_true",
        help="train LoRA adapters instead of every weight (the reference is the base model: no second copy)")
    add("--device", default="auto", choices=["auto", "cpu", "cuda"],
        help="where the steps run (auto: cuda when available) (default: %(default)s)")
    add("--repeats", type=positive_int, default=3, help="timed steps after one warm-up step; the median is reported "
                                               "(default: %(default)s)")
    add("--threads", type=thread_count_type(), help="torch CPU threads in each measurement (default: torch's own)")
    add("--budget-gb", type=positive_float("a memory budget in GiB", high=MAX_BUDGET_GIB),
        help="memory budget in GiB: also search the longest completion length that fits it (default: no search)")
    add("--start-length", type=positive_int, default=256,
        help="first completion length the search probes; it doubles from there (default: %(default)s)")
    add("--max-length", type=positive_int, default=65536,
        help="the search's upper limit: '>= L' means L itself fits (default: %(default)s)")
    add("--resolution", type=positive_int, default=64,
        help="the bisection after the doubling stops within this many tokens (default: %(default)s)")
    return parser
