"""The least memory one step of `grpo-engine bench` takes, known from its sizes before anything is allocated.

A step's size is the product of its options (--batch-size x (--prompt-length + --completion-length) tokens, each a
row of the model's width and, for a loss that forms the logits, of its vocabulary) and of the architecture (its
weights, twice without --lora: the policy and its frozen reference). Sizes past the machine were found in the
measuring process: `--batch-size 100000 --completion-length 1000000` ended, after the model was built, in torch's
"DefaultCPUAllocator: can't allocate memory" naming no option; `--model llama-3-8b` on a 24 GiB machine filled it
before the kernel's out-of-memory killer ended the measurement; and a length search from --start-length 2147483647
ran its first probe for as long as the machine swapped (over five minutes, without a line). Here a step whose least
memory is over the device's is refused naming the options, and a search probe over it (or over the budget) is a
miss without a process.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..resource_limits import soft_limit


def weight_count(config) -> int:
    """A lower bound of the parameters of a decoder `config` (a transformers Qwen2 / Llama config), by arithmetic:
    the embeddings (and an untied head), each layer's query and output projections and its MLP; the key and value
    projections, biases and norms left out. (Building the model on the meta device took minutes at
    `--layers 2147483647`, and failed on a width whose weight's bytes overflow.)"""
    hidden, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    embeddings = config.vocab_size * hidden * (1 if getattr(config, "tie_word_embeddings", False) else 2)
    layer = 2 * hidden * heads * head_dim + 3 * hidden * config.intermediate_size
    return embeddings + config.num_hidden_layers * layer


def least_step_bytes(config, weights: int, batch: int, prompt: int, completion: int, element_bytes: int,
                     lora: bool, forms_logits: bool) -> int:
    """A lower bound of one step's memory: the weights (twice without LoRA), one hidden state of every token, and,
    where the loss forms them, the completion tokens' logits. The step holds far more (gradients, AdamW's moments,
    every layer's activations): a size over this bound cannot fit, one under it may not."""
    tokens = batch * (prompt + completion)
    held = weights * element_bytes * (1 if lora else 2) + tokens * config.hidden_size * element_bytes
    return held + (batch * completion * config.vocab_size * element_bytes if forms_logits else 0)


def _meminfo_bytes(key: str) -> Optional[int]:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_limit() -> Optional[int]:
    """The memory limit of this process's cgroup (a container's), or None."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as limit:
                text = limit.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # "max", or cgroup v1's "no limit" (near 2**63)
            return int(text)
    return None


def device_memory(device: str) -> Optional[tuple[int, str]]:
    """(bytes, what they are) a measuring process on `device` may use at most, or None when unknown: a GPU's total
    memory; on a CPU the machine's memory and swap, within the container's limit and the address-space limit."""
    if device == "cuda":
        return torch.cuda.get_device_properties(0).total_memory, "GPU's memory"
    ram = _meminfo_bytes("MemTotal")
    if ram is None:
        return None
    bounds = [(ram + (_meminfo_bytes("SwapTotal") or 0), "memory and swap")]
    limit = _cgroup_limit()
    if limit is not None:
        bounds.append((limit, "container's memory limit"))
    address_space = soft_limit("RLIMIT_AS")
    if address_space is not None:
        bounds.append((address_space, "address space (ulimit -v)"))
    return min(bounds)


def gib(size: int) -> str:
    return f"{size / 2**30:,.1f} GiB"

