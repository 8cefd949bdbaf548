"""Rollout tokens per second, `hf` against `vllm`, on one tiny random Qwen2 the script builds (no download).

Both backends go through the engine's own rollout interface with the same prompts and sampling settings; each
is warmed up once, then timed over --repeats rounds. Completion tokens are counted up to and including EOS
(random weights stop at random lengths, which both backends share only in distribution).
Needs vLLM (its CPU build in .ci/vllm_tests' environment on a CPU machine):
    .venv-vllm/bin/python -m grpo_engine.tools.rollout_speed --threads 2
"""

from __future__ import annotations

import sys

import os
import tempfile
import time
from types import SimpleNamespace

from typing import Optional, Sequence

import torch

from ..cli_parser import CommandParser, doc_summary
from ..cli_types import multiple_of, positive_int, thread_count_type
from ..command_failure import run_tool


def model_config(hidden: int, layers: int, vocab_rows: int = 0):
    """The Qwen2 config build_model writes."""
    from transformers import Qwen2Config

    from grpo_engine.data.demo_task import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    return Qwen2Config(vocab_size=max(vocab_rows, len(tokenizer)), hidden_size=hidden, intermediate_size=3 * hidden,
                       num_hidden_layers=layers, num_attention_heads=hidden // 32, num_key_value_heads=1,
                       max_position_embeddings=1024, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                       eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)


def check_runs_here(parser: CommandParser, hidden: int, layers: int) -> None:
    """Before the model is built: every backend it times installed (vLLM was found missing after the hf backend's
    rounds, in a traceback), and the model's weights within the machine's memory, in this process and in vLLM's
    (`--hidden 2147483616` ended in torch's "can't allocate memory" traceback)."""
    from grpo_engine.rollout.registry import ROLLOUT_BACKENDS, backends_with

    from .bench_memory import device_memory, gib, weight_count

    for name in backends_with(generates_ahead=False):
        ROLLOUT_BACKENDS[name].check_installed()
    # The config's sizes without the config, which itself takes minutes at --layers 2147483647 (a list per layer).
    sizes = SimpleNamespace(hidden_size=hidden, num_attention_heads=hidden // 32, head_dim=32, vocab_size=99,
                            tie_word_embeddings=True, intermediate_size=3 * hidden, num_hidden_layers=layers)
    need = 2 * 4 * weight_count(sizes)  # float32, twice: the policy and vLLM's copy
    memory = device_memory("cpu")
    if memory is not None and need > memory[0]:
        parser.error(f"--hidden {hidden} with --layers {layers} makes a model of {gib(need // 2)} of float32 weights, "
                     f"held twice: more than this machine's {gib(memory[0])} of {memory[1]}")


def build_model(directory: str, hidden: int, layers: int, seed: int, vocab_rows: int = 0) -> None:
    """A random Qwen2 with the demo's character tokenizer and head size 32 (vLLM's CPU attention has no kernel for
    16); `vocab_rows` > the tokenizer's 99 pads the vocabulary as Qwen2.5 does."""
    from transformers import Qwen2ForCausalLM

    from grpo_engine.data.demo_task import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = model_config(hidden, layers, vocab_rows)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def timed_rounds(backend, prompts: list[str], repeats: int) -> tuple[int, float]:
    backend.generate(prompts)  # warm-up: first-call allocations and caches
    tokens, seconds = 0, 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        batch = backend.generate(prompts)
        seconds += time.perf_counter() - start
        tokens += int(batch.completion_attention.sum())
    return tokens, seconds


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = CommandParser(prog="python -m grpo_engine.tools.rollout_speed", description=doc_summary(__doc__))
    parser.add_argument("--prompts", type=positive_int, default=32, help="completions per round (default 32)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=64, help="the longest completion (default 64)")
    parser.add_argument("--hidden", type=multiple_of(32), default=256,
                        help="hidden size, a multiple of 32 (default 256)")
    parser.add_argument("--layers", type=positive_int, default=4, help="decoder layers (default 4)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="timed rounds per backend (default 3)")
    parser.add_argument("--threads", type=thread_count_type(), default=1, help="torch CPU threads (default 1)")
    args = parser.parse_args(argv)
    check_runs_here(parser, args.hidden, args.layers)
    torch.set_num_threads(args.threads)

    from grpo_engine.config import load_config
    from grpo_engine.model.loading import load_causal_lm, load_tokenizer
    from grpo_engine.rollout import create_backend
    from grpo_engine.rollout.registry import backends_with

    with tempfile.TemporaryDirectory() as directory:
        build_model(directory, args.hidden, args.layers, seed=0)
        config = load_config(None, {"model.name_or_path": directory, "rollout.max_new_tokens": args.max_new_tokens,
                                    "data.max_prompt_length": 32, "rollout.vllm.kv_cache_mb": 256})
        device = torch.device("cpu")
        lm = load_causal_lm(directory, config.model, device)
        tokenizer = load_tokenizer(directory)
        prompts = [f"{i % 10}+{i // 10}=" for i in range(args.prompts)]
        print(f"Qwen2 hidden {args.hidden}, {args.layers} layers, vocab {len(tokenizer)}; {args.prompts} prompts x "
              f"up to {args.max_new_tokens} tokens; {args.threads} thread(s); OMP_NUM_THREADS="
              f"{os.environ.get('OMP_NUM_THREADS', 'unset')}")
        for name in backends_with(generates_ahead=False):  # the registry's backends that generate in this process
            config.rollout.backend = name
            torch.manual_seed(0)
            backend = create_backend(config, lm, lm, tokenizer, device, directory)
            tokens, seconds = timed_rounds(backend, prompts, args.repeats)
            print(f"{name:5s} {tokens:7d} tokens in {seconds:7.2f} s: {tokens / seconds:9.1f} tokens/s")
            del backend


if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m grpo_engine.tools.rollout_speed"))
