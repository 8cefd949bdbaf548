"""Every way to compute the GRPO loss, as a zero-argument `step` closure over one case's inputs.

A path that cannot run a case (package missing, needs CUDA, no such operation) raises PathUnavailable
with the reason; the benchmark turns it into a skip that names the reason.
"""

from __future__ import annotations

import importlib.util
from typing import Callable

import torch

import grpo_kernels
from grpo_kernels import GRPOLossConfig, grpo_objective
from grpo_kernels.backends import backend_names, get_backend

from .cases import LOSS_CASES, LossCase
from .inputs import BenchInputs
from .shapes import TRITON_INTERPRETER_MAX_MACS, BenchShape, macs

# This package's backends as its registry lists them (so a backend added there is benchmarked without an edit
# here), the baseline first: every ratio is taken against it.
OWN_BACKENDS = backend_names(with_auto=False)
# trl: TRL 1.16's GRPOTrainer loss step (its fused LM head and its own loss arithmetic, benchmarks/suite/trl_path.py).
PATHS = (*OWN_BACKENDS, "liger", "cce", "trl")
# backend="auto": the route the cost model picks per call (grpo_kernels/routing.py); the GPU command runs it, the
# CPU suite does not (on a CPU it is the gemm path).
ROUTED = ("auto",)

Step = Callable[[], object]


class PathUnavailable(Exception):
    """This path cannot run this case; str(exception) says why."""


def _require_package(module: str, pip_name: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise PathUnavailable(f"{pip_name} is not installed (pip install {pip_name})")


def require_trl() -> None:
    """Raise PathUnavailable unless a TRL release the trl path was checked against is installed."""
    _require_package("trl", "trl")
    try:  # the integration accepts only the TRL releases whose GRPOTrainer internals it was checked against
        importlib.import_module("grpo_kernels.integrations.trl")
    except ImportError as error:
        raise PathUnavailable(str(error)) from None


def _require_cuda(device: torch.device, what: str) -> None:
    if device.type != "cuda":
        raise PathUnavailable(f"{what} runs only on CUDA tensors (Triton GPU kernels); this run is on {device.type}")


def check_available(path: str, operation: str, shape: BenchShape, device: torch.device) -> None:
    """Raise PathUnavailable when `path` cannot run `operation` at `shape` on `device`."""
    if path not in (*PATHS, *ROUTED):
        raise ValueError(f"path must be one of {(*PATHS, *ROUTED)}, got {path!r}")
    if path in OWN_BACKENDS and get_backend(path).triton_kernels:
        _require_package("triton", "triton")
        if device.type == "cpu" and macs(shape) > TRITON_INTERPRETER_MAX_MACS:
            raise PathUnavailable(
                f"{path} on CPU runs in the Triton interpreter; N*H*V = {macs(shape)} is above the "
                f"{TRITON_INTERPRETER_MAX_MACS} it finishes in seconds")
    elif path == "liger":
        _require_package("liger_kernel", "liger-kernel")
        if operation == "logprobs":
            raise PathUnavailable("Liger has no public forward-only log-prob operation")
        if operation == "logits":
            _require_cuda(device, "Liger's logits-input triton_grpo_loss")
    elif path == "cce":
        _require_package("cut_cross_entropy", "cut-cross-entropy")
        if operation == "logits":
            raise PathUnavailable("Cut Cross-Entropy starts from hidden states; it has no logits-input loss")
        _require_cuda(device, "Cut Cross-Entropy's linear_cross_entropy")
    elif path == "trl":
        require_trl()
        if operation == "logits":
            raise PathUnavailable("TRL's GRPOTrainer starts from hidden states (its fused LM head); it has no "
                                  "loss from precomputed logits")


def right_padded_mask(batch: int, seq_len: int, valid_fraction: float, device: torch.device) -> torch.Tensor:
    """[batch, seq_len] int64 mask with round(valid_fraction * batch * seq_len) ones, each row ones then zeros.

    Row lengths spread evenly around the mean (GRPO completions differ in length), each in [1, seq_len].
    """
    if not 0.0 < valid_fraction <= 1.0:
        raise ValueError(f"valid_fraction must be in (0, 1], got {valid_fraction}")
    total = max(batch, round(valid_fraction * batch * seq_len))
    mean = total / batch
    spread = max(0.0, min(mean - 1, seq_len - mean)) / 2 if batch > 1 else 0.0
    lengths = (mean + torch.linspace(-spread, spread, batch, dtype=torch.float64)).floor().long().clamp(1, seq_len)
    for row in range(batch):  # the floors dropped less than one per row: hand the rest to rows with room
        if int(lengths.sum()) == total:
            break
        lengths[row] += int(lengths[row] < seq_len)
    return (torch.arange(seq_len)[None, :] < lengths[:, None]).to(device=device, dtype=torch.int64)


def case_mask(inputs: BenchInputs, case: LossCase) -> torch.Tensor:
    """The completion mask a case runs with: the inputs' own, or right padding at the case's valid fraction."""
    if case.valid_fraction is None:
        return inputs.completion_mask
    batch, seq_len = inputs.completion_mask.shape
    return right_padded_mask(batch, seq_len, case.valid_fraction, inputs.completion_mask.device)


def valid_tokens(inputs: BenchInputs, case_name: str) -> int:
    """Positions with completion_mask != 0 in a case (the floor, case "-", runs the inputs' own mask)."""
    mask = case_mask(inputs, LOSS_CASES[case_name]) if case_name in LOSS_CASES else inputs.completion_mask
    return int(mask.sum())


def _loss_kwargs(inputs: BenchInputs, case: LossCase) -> dict:
    return {
        "old_logps": inputs.old_logps if case.uses_old_logps else None,
        "ref_logps": inputs.ref_logps if case.uses_ref_logps else None,
    }


def _liger_module(config: GRPOLossConfig, device: torch.device) -> torch.nn.Module:
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    # torch.compile of Liger's loss math needs a GPU toolchain to pay off; on CPU it only adds compile time.
    # Each case compiles afresh for its own shape: Dynamo's automatic dynamic-shape recompile after a shape
    # change (S1 then S2) raised InternalTorchDynamoError in torch 2.11 on the H200 (benchmarks/results/h200.md).
    torch._dynamo.reset()
    return LigerFusedLinearGRPOLoss(
        beta=config.beta, compiled=device.type == "cuda", use_ref_model=config.beta != 0.0,
        epsilon_low=config.epsilon_low, epsilon_high=config.epsilon_high_value, loss_type=config.loss_type,
        max_completion_length=config.max_completion_length,
        importance_sampling_level=config.importance_sampling_level, temperature=config.temperature,
        delta=config.delta, use_bias_correction_kl=config.use_bias_correction_kl,
        sapo_temperature_pos=config.sapo_temperature_pos, sapo_temperature_neg=config.sapo_temperature_neg)


def _cce_logps(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    from cut_cross_entropy import linear_cross_entropy

    # Per-token cross-entropy is -log p(target): CCE as a log-prob engine (no temperature, no entropy).
    return -linear_cross_entropy(hidden, weight, ids, reduction="none").float()


def make_loss_step(path: str, inputs: BenchInputs, case: LossCase) -> Step:
    """Loss forward + backward; the step returns the gradients w.r.t. hidden and weight (hidden only when the
    case freezes the head: the weight is then passed detached, as a frozen LM head under LoRA is)."""
    weight = inputs.weight.detach() if case.frozen_head else inputs.weight
    leaves = (inputs.hidden,) if case.frozen_head else (inputs.hidden, weight)
    mask = case_mask(inputs, case)
    if path in OWN_BACKENDS or path in ROUTED:
        def step():
            out = grpo_kernels.fused_linear_grpo_loss(
                inputs.hidden, weight, inputs.completion_ids, mask, inputs.advantages,
                config=case.config, backend=path, **_loss_kwargs(inputs, case))
            return torch.autograd.grad(out.loss, leaves)
        return step
    if path == "liger":
        module = _liger_module(case.config, inputs.hidden.device)

        def step():
            kwargs = _loss_kwargs(inputs, case)
            loss, _metrics = module(inputs.hidden, weight, inputs.completion_ids, mask, inputs.advantages,
                                    ref_per_token_logps=kwargs["ref_logps"], old_per_token_logps=kwargs["old_logps"])
            return torch.autograd.grad(loss, leaves)
        return step
    if path == "cce":
        if case.config.temperature != 1.0:
            raise PathUnavailable("Cut Cross-Entropy has no sampling temperature")

        def step():
            logps = _cce_logps(inputs.hidden, weight, inputs.completion_ids)
            # The objective needs no entropy for these configs (no entropy bonus or mask): zeros stand in.
            loss, _metrics = grpo_objective(logps, torch.zeros_like(logps), mask,
                                            inputs.advantages, case.config, **_loss_kwargs(inputs, case))
            return torch.autograd.grad(loss, leaves)
        return step
    if path == "trl":
        from . import trl_path

        return trl_path.loss_step(inputs.hidden, weight, inputs.completion_ids, mask, inputs.advantages,
                                  case.config, leaves=leaves, **_loss_kwargs(inputs, case))
    raise ValueError(f"path must be one of {PATHS}, got {path!r}")


def make_logprobs_step(path: str, inputs: BenchInputs) -> Step:
    """Forward-only per-token log-probs, as for old/ref log-probs: no autograd graph is built."""
    if path in OWN_BACKENDS or path in ROUTED:
        def step():
            with torch.no_grad():
                return grpo_kernels.linear_logprobs(inputs.hidden, inputs.weight, inputs.completion_ids, backend=path)
        return step
    if path == "cce":
        def step():
            with torch.no_grad():
                return _cce_logps(inputs.hidden, inputs.weight, inputs.completion_ids)
        return step
    if path == "trl":
        from . import trl_path

        return trl_path.logprobs_step(inputs.hidden, inputs.weight, inputs.completion_ids)
    raise PathUnavailable(f"{path} has no forward-only log-prob operation")


def make_logits_step(path: str, inputs: BenchInputs, case: LossCase) -> Step:
    """The loss from precomputed [B, T, V] logits, forward + backward; returns the logits' gradient.

    The logits tensor is built here, once per case, so it counts as an input, not as extra memory.
    """
    if path in OWN_BACKENDS or path in ROUTED:
        logits = inputs.logits()

        def step():
            out = grpo_kernels.grpo_loss_from_logits(
                logits, inputs.completion_ids, inputs.completion_mask, inputs.advantages,
                config=case.config, backend=path, **_loss_kwargs(inputs, case))
            return torch.autograd.grad(out.loss, logits)
        return step
    if path == "liger":
        from liger_kernel.transformers.grpo_loss import triton_grpo_loss

        # Liger takes the model's [B, T + 1, V] output and drops the last position itself.
        with torch.no_grad():
            base = inputs.logits()
            logits = torch.cat([base, base[:, -1:]], dim=1).requires_grad_(True)
            del base
        config = case.config

        def step():
            kwargs = _loss_kwargs(inputs, case)
            # inplace=False: the in-place backward would overwrite the logits every later round reuses.
            loss, _metrics = triton_grpo_loss(
                logits, kwargs["old_logps"], kwargs["ref_logps"], inputs.completion_ids, inputs.advantages,
                inputs.completion_mask, temperature=config.temperature, beta=config.beta,
                eps_low=config.epsilon_low, eps_high=config.epsilon_high_value, inplace=False,
                loss_type=config.loss_type, max_completion_length=config.max_completion_length,
                importance_sampling_level=config.importance_sampling_level, reduce=True)
            return torch.autograd.grad(loss, logits)
        return step
    raise PathUnavailable(f"{path} has no logits-input loss")


def make_floor_step(operation: str, inputs: BenchInputs) -> Step:
    """Bare GEMMs of the same shapes: the time no exact fused loss can beat.

    loss: logits = h W^T, dH = G W, dW = G^T h (G stands in for the logits' gradient; it has the same
    shape as the logits, so the forward's output is reused). logprobs: the first GEMM alone.
    """
    hidden = inputs.hidden.detach().reshape(-1, inputs.hidden.shape[-1])
    weight = inputs.weight.detach()
    if operation == "logprobs":
        return lambda: torch.matmul(hidden, weight.T)
    if operation == "loss":
        def step():
            logits = torch.matmul(hidden, weight.T)
            return torch.matmul(logits, weight), torch.matmul(logits.T, hidden)
        return step
    raise PathUnavailable(f"no GEMM floor for operation {operation!r} (it has no GEMM)")


def make_step(path: str, operation: str, inputs: BenchInputs, case: LossCase) -> Step:
    """The step of `path` for `operation` (`case` is ignored by the config-free logprobs operation)."""
    if operation == "loss":
        return make_loss_step(path, inputs, case)
    if operation == "logprobs":
        return make_logprobs_step(path, inputs)
    if operation == "logits":
        return make_logits_step(path, inputs, case)
    raise ValueError(f"operation must be loss, logprobs or logits, got {operation!r}")
