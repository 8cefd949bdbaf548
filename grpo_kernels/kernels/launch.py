"""Entry point of the Triton backend: picks the interpreter for CPU tensors, the block/warp/stage entry
of configs.py for the GPU's architecture and the dot precision, then calls the kernel families' launchers."""

from __future__ import annotations

import dataclasses
import os
import sys

import torch
import torch.nn.functional as F

from .configs import GPU_CONFIGS, INTERPRETER_CONFIGS, KernelConfig, arch_of, dtype_class
from .interpreter_switch import TRUE_VALUES, interpreting  # noqa: F401  (read from here by the backends and the tests)


def use_interpreter_if_no_gpu() -> None:
    """On a machine without CUDA, Triton can only run interpreted, and the interpreter must be chosen before
    triton itself is imported (its standard library is built at import). grpo_kernels calls this on import."""
    if "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def prepare(device: torch.device) -> None:
    """Non-CUDA tensors need the Triton interpreter, which must be on before triton is imported."""
    if device.type == "cuda" or interpreting():
        return
    if "triton" in sys.modules:
        value = os.environ.get("TRITON_INTERPRET")
        unread = "" if value is None else f" (TRITON_INTERPRET={value!r}, which Triton reads as off: it takes " \
                                          f"{', '.join(TRUE_VALUES)})"
        raise RuntimeError(
            f"the Triton backends on CPU tensors need the Triton interpreter, but triton was already imported "
            f"without it{unread}; set TRITON_INTERPRET=1 before importing torch/triton, or use backend='torch'"
        )
    os.environ["TRITON_INTERPRET"] = "1"


def _check_dtype(x: torch.Tensor, name: str) -> None:
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"backend='triton' supports float32, bfloat16 and float16 {name}, got {x.dtype}; "
                        "use backend='torch' for float64")


def config_for(kernel: str, dtype: torch.dtype, device: torch.device) -> KernelConfig:
    """The table entry of one kernel for this device's architecture and the input dtype."""
    if interpreting():
        return INTERPRETER_CONFIGS[kernel]
    arch = arch_of(torch.cuda.get_device_capability(device))
    return GPU_CONFIGS[arch][kernel][dtype_class(dtype == torch.float32)]


def _linear_options(dtype: torch.dtype) -> tuple[bool, str]:
    upcast = interpreting()
    # float32 inputs get exact (not TF32) dots so they meet float32 tolerances; 16-bit inputs use tensor cores.
    precision = "ieee" if (dtype == torch.float32 or upcast) else "tf32"
    return upcast, precision


def padded_to_block_k(hidden: torch.Tensor, head, block_k: int):
    """(hidden, head) with H a multiple of block_k: the linear kernels load whole K slices, unmasked (their
    registers go to the logits tile's softmax math). Every real LM head's H is a multiple of 64, so this copies
    nothing there; any other H gets zero columns appended to a copy of hidden and of the weight (zeros add nothing
    to any dot product)."""
    pad = -hidden.shape[1] % block_k
    if pad == 0:
        return hidden, head
    return F.pad(hidden, (0, pad)), dataclasses.replace(head, weight=F.pad(head.weight, (0, pad)))


def linear_forward(hidden, head, targets):
    """hidden [N, H], head (grpo_kernels.head.LMHead), targets [N] -> (logps, entropy, lse)."""
    prepare(hidden.device)
    _check_dtype(hidden, "hidden")
    from .linear_forward import linear_forward as launch_forward

    upcast, precision = _linear_options(hidden.dtype)
    configs, stats = _forward_kernel(hidden, persistent=hopper(hidden.device))
    return launch_forward(*padded_to_block_k(hidden, head, configs[0].block_k), targets, configs, upcast, precision,
                          stats)


def hopper(device: torch.device) -> bool:
    """A Hopper GPU (sm_90a): the forward takes the persistent TMA kernel (persistent_forward.py) there; the 2-D grid
    of linear_forward.py stays for other GPUs and for the interpreter's runs of the `triton` backend."""
    return device.type == "cuda" and not interpreting() and arch_of(torch.cuda.get_device_capability(device)) == "sm90"


def _forward_kernel(hidden: torch.Tensor, persistent: bool):
    """((statistics entry, merge entry), the partial-statistics launcher) of the forward."""
    merge = config_for("merge", hidden.dtype, hidden.device)
    if not persistent:
        return (config_for("forward", hidden.dtype, hidden.device), merge), None
    from .persistent_forward import persistent_partial_stats

    return (config_for("persistent", hidden.dtype, hidden.device), merge), persistent_partial_stats


def persistent_forward(hidden, head, targets, chunk=None, tile_max=None, config: KernelConfig | None = None):
    """linear_forward's (logps, entropy, lse) by the persistent TMA kernel on any device (interpreted on CPU); with
    `chunk` ([N, V] in hidden's dtype, rows 16-byte aligned) and `tile_max` ([N, chunk_tiles(V, ...)] float32) each
    logits tile's exponentials and row maxima are also written there (persistent_forward.py). `config`: tiles and
    pipeline in place of the table's entry, for a sweep that times other entries (benchmarks/triton_check.py (d));
    not with `chunk`, whose tiles chunk_tiles sizes from the table."""
    prepare(hidden.device)
    _check_dtype(hidden, "hidden")
    if config is not None and chunk is not None:
        raise ValueError("persistent_forward: config replaces the table's tiles only without a chunk to store")
    from functools import partial

    from .linear_forward import linear_forward as launch_forward

    upcast, precision = _linear_options(hidden.dtype)
    configs, stats = _forward_kernel(hidden, persistent=True)
    if config is not None:
        configs = (config, configs[1])
    return launch_forward(*padded_to_block_k(hidden, head, configs[0].block_k), targets, configs, upcast, precision,
                          partial(stats, chunk=chunk, tile_max=tile_max))


def chunk_tiles(vocab_size: int, dtype: torch.dtype, device: torch.device) -> int:
    """Vocabulary tiles of the persistent forward a row has: the columns of its stored maxima (tile_max)."""
    return -(-vocab_size // config_for("persistent", dtype, device).block_v)


def chunk_grad_(chunk, tile_max, head, targets, lse, entropy, grad_logps, grad_entropy):
    """persistent_forward's stored chunk [rows, V] turned into dLoss/d(raw logits) in place (chunk_grad.py); returns
    the chunk."""
    from .chunk_grad import chunk_grad_ as launch_chunk_grad

    config = config_for("chunk_grad", chunk.dtype, chunk.device)
    # one stored maximum per row and forward tile: the dz pass's tiles are the forward's
    assert config.block_v == config_for("persistent", chunk.dtype, chunk.device).block_v
    return launch_chunk_grad(chunk, tile_max, head, targets, lse, entropy, grad_logps, grad_entropy, config,
                             interpreting())


def persistent_dz(hidden, head, targets, lse, entropy, grad_logps, grad_entropy, v0: int, out):
    """dLoss/d(raw logits) of hidden's rows and head columns [v0, v0 + out.shape[1]) written into `out` (any float
    dtype, rows 16-byte aligned) by the persistent TMA kernel, from the rows' statistics and g, e
    (persistent_grad.py); returns `out`."""
    prepare(hidden.device)
    _check_dtype(hidden, "hidden")
    from .persistent_grad import persistent_dz as launch_dz

    upcast, precision = _linear_options(hidden.dtype)
    config = config_for("persistent_dz", hidden.dtype, hidden.device)
    return launch_dz(*padded_to_block_k(hidden, head, config.block_k), targets, lse, entropy, grad_logps,
                     grad_entropy, v0, out, config, upcast, precision)


def forward_plan(N: int, V: int, dtype: torch.dtype, device: torch.device):
    """The forward's launch plan (kernels/linear_forward.plan) for a shape on this device: a pure function of
    (N, V), the dtype and the architecture; its split boundaries depend on V only."""
    from .linear_forward import plan

    return plan(N, V, config_for("persistent" if hopper(device) else "forward", dtype, device))


def linear_backward(grad_logps, grad_entropy, hidden, head, targets, lse, entropy,
                    needs_hidden_grad: bool = True, needs_weight_grad: bool = True):
    """(grad_hidden, grad_weight, grad_bias); a gradient not needed is None and its kernel does not run
    (a frozen LM head costs no dW work and no V x H buffer). grad_bias follows needs_weight_grad."""
    from .linear_backward import linear_backward as launch_backward

    configs = (config_for("grad_hidden", hidden.dtype, hidden.device),
               config_for("grad_weight", hidden.dtype, hidden.device))
    return _backward_padded(hidden, head, max(c.block_k for c in configs), lambda hidden, head, upcast, precision:
                            launch_backward(grad_logps, grad_entropy, hidden, head, targets, lse, entropy, configs,
                                            upcast, precision, needs_hidden_grad, needs_weight_grad))


def linear_backward_tiles(grad_logps, grad_entropy, hidden, head, targets, lse, entropy,
                          needs_hidden_grad: bool = True, needs_weight_grad: bool = True):
    """linear_backward's gradients, a trained head's by tile_backward.py's one kernel (each logits tile recomputed
    once for dH and dW; float32 atomics: not bitwise repeatable run to run). With one gradient there is nothing
    to share, and linear_backward's kernel runs."""
    if not (needs_hidden_grad and needs_weight_grad):
        return linear_backward(grad_logps, grad_entropy, hidden, head, targets, lse, entropy, needs_hidden_grad,
                               needs_weight_grad)
    from .tile_backward import tile_backward

    config = config_for("grad_tiles", hidden.dtype, hidden.device)
    return _backward_padded(hidden, head, config.block_k, lambda hidden, head, upcast, precision:
                            tile_backward(grad_logps, grad_entropy, hidden, head, targets, lse, entropy, config,
                                          upcast, precision))


def _backward_padded(hidden, head, block_k: int, launch_backward):
    """launch_backward(hidden, head, upcast, precision) with H padded to block_k; the padded columns' gradients go."""
    prepare(hidden.device)
    _check_dtype(hidden, "hidden")
    upcast, precision = _linear_options(hidden.dtype)
    H = hidden.shape[1]
    padded_hidden, padded_head = padded_to_block_k(hidden, head, block_k)
    grad_hidden, grad_weight, grad_bias = launch_backward(padded_hidden, padded_head, upcast, precision)
    if padded_hidden is not hidden:
        grad_hidden = None if grad_hidden is None else grad_hidden[:, :H].contiguous()
        grad_weight = None if grad_weight is None else grad_weight[:, :H].contiguous()
    return grad_hidden, grad_weight, grad_bias


def logits_forward(logits, targets, temperature):
    prepare(logits.device)
    _check_dtype(logits, "logits")
    from .logits import logits_forward as launch_forward

    return launch_forward(logits, targets, temperature, config_for("logits", logits.dtype, logits.device),
                          interpreting())


def logits_backward(grad_logps, grad_entropy, logits, targets, lse, entropy, temperature):
    prepare(logits.device)
    from .logits import logits_backward as launch_backward

    return launch_backward(grad_logps, grad_entropy, logits, targets, lse, entropy, temperature,
                           config_for("logits", logits.dtype, logits.device), interpreting())


def linear_grpo_forward(hidden, head, targets, advantages, token_weights, entropy_weights, old_logps,
                        ref_logps, importance_ratio, mask, objective):
    prepare(hidden.device)
    _check_dtype(hidden, "hidden")
    from .linear_forward import linear_grpo_forward as launch_forward

    upcast, precision = _linear_options(hidden.dtype)
    configs, stats = _forward_kernel(hidden, persistent=hopper(hidden.device))
    return launch_forward(*padded_to_block_k(hidden, head, configs[0].block_k), targets, advantages, token_weights,
                          entropy_weights, old_logps, ref_logps, importance_ratio, mask, objective, configs, upcast,
                          precision, stats)
