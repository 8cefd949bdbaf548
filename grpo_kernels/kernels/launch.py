"""Entry point of the Triton backend: picks the interpreter for CPU tensors, the block shapes, and
the dot precision, then calls the kernel families' launchers."""

from __future__ import annotations

import os
import sys

import torch

# Block shapes. GPU: a 64-token x 128-vocab logits tile over 64-wide slices of H. Interpreter: bigger
# numpy blocks mean fewer Python-level programs, which is what its run time is made of.
_GPU_BLOCKS = {"BLOCK_N": 64, "BLOCK_V": 128, "BLOCK_K": 64}
_INTERPRETER_BLOCKS = {"BLOCK_N": 32, "BLOCK_V": 64, "BLOCK_K": 32}
_GPU_LOGITS_BLOCKS = {"BLOCK_N": 4, "BLOCK_V": 1024}
_INTERPRETER_LOGITS_BLOCKS = {"BLOCK_N": 16, "BLOCK_V": 64}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


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
        raise RuntimeError(
            "backend='triton' on CPU tensors needs the Triton interpreter, but triton was already imported without "
            "it; set TRITON_INTERPRET=1 before importing torch/triton, or use backend='torch'"
        )
    os.environ["TRITON_INTERPRET"] = "1"


def _check_dtype(x: torch.Tensor, name: str) -> None:
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"backend='triton' supports float32, bfloat16 and float16 {name}, got {x.dtype}; "
                        "use backend='torch' for float64")


def _linear_options(dtype: torch.dtype) -> tuple[dict, bool, str]:
    upcast = interpreting()
    blocks = dict(_INTERPRETER_BLOCKS if upcast else _GPU_BLOCKS)
    # float32 inputs get exact (not TF32) dots so they meet float32 tolerances; 16-bit inputs use tensor cores.
    precision = "ieee" if (dtype == torch.float32 or upcast) else "tf32"
    return blocks, upcast, precision


def linear_forward(hidden, weight, bias, targets, temperature):
    prepare(hidden.device)
    _check_dtype(hidden, "hidden")
    from .linear_forward import linear_forward as launch_forward

    blocks, upcast, precision = _linear_options(hidden.dtype)
    return launch_forward(hidden, weight, bias, targets, temperature, blocks, upcast, precision)


def linear_backward(grad_logps, grad_entropy, hidden, weight, bias, targets, lse, entropy, temperature,
                    needs_hidden_grad=True, needs_weight_grad=True):
    prepare(hidden.device)
    _check_dtype(hidden, "hidden")
    from .linear_backward import linear_backward as launch_backward

    blocks, upcast, precision = _linear_options(hidden.dtype)
    grad_hidden, grad_weight, grad_bias = launch_backward(grad_logps, grad_entropy, hidden, weight, bias, targets,
                                                          lse, entropy, temperature, blocks, upcast, precision)
    return (grad_hidden if needs_hidden_grad else None, grad_weight if needs_weight_grad else None,
            grad_bias if needs_weight_grad else None)


def logits_forward(logits, targets, temperature):
    prepare(logits.device)
    _check_dtype(logits, "logits")
    from .logits import logits_forward as launch_forward

    return launch_forward(logits, targets, temperature,
                          _INTERPRETER_LOGITS_BLOCKS if interpreting() else _GPU_LOGITS_BLOCKS)


def logits_backward(grad_logps, grad_entropy, logits, targets, lse, entropy, temperature):
    prepare(logits.device)
    from .logits import logits_backward as launch_backward

    return launch_backward(grad_logps, grad_entropy, logits, targets, lse, entropy, temperature,
                           _INTERPRETER_LOGITS_BLOCKS if interpreting() else _GPU_LOGITS_BLOCKS)


def linear_grpo_forward(hidden, weight, bias, targets, advantages, token_weights, entropy_weights, old_logps,
                        ref_logps, importance_ratio, mask, temperature, objective):
    prepare(hidden.device)
    _check_dtype(hidden, "hidden")
    from .linear_forward import linear_grpo_forward as launch_forward

    blocks, upcast, precision = _linear_options(hidden.dtype)
    return launch_forward(hidden, weight, bias, targets, advantages, token_weights, entropy_weights, old_logps,
                          ref_logps, importance_ratio, mask, temperature, objective, blocks, upcast, precision)
