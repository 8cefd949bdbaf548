"""Deterministic benchmark inputs: hidden states, LM head, completions sampled from the policy itself."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .cases import PEAKED_TARGET_ENTROPY, REGIMES
from .shapes import BenchShape

# Rows of [rows, V] float32 logits materialised at a time while sampling (about 256 MiB).
_SAMPLING_ELEMENTS = 2**26
_ENTROPY_PROBE_ROWS = 512
# Jitter of the sampler's and the reference model's log-probs around the policy's: a slightly
# off-policy batch whose ratios fall outside the 0.2 clip range for some tokens, as in real runs.
_OLD_LOGPS_NOISE = 0.1
_REF_LOGPS_NOISE = 0.2


@dataclass
class BenchInputs:
    hidden: torch.Tensor  # [B, T, H], requires grad
    weight: torch.Tensor  # [V, H], requires grad
    completion_ids: torch.Tensor  # [B, T] int64, sampled from softmax(hidden @ weight.T)
    completion_mask: torch.Tensor  # [B, T] int64, right padding
    advantages: torch.Tensor  # [B] float32
    old_logps: torch.Tensor  # [B, T] float32
    ref_logps: torch.Tensor  # [B, T] float32
    mean_entropy: float  # nats, over the active tokens
    logit_scale: float  # factor the weight was scaled by (1.0 for flat)

    def logits(self) -> torch.Tensor:
        """[B, T, V] logits in the input dtype, as a leaf that requires grad (the logits-input cases)."""
        with torch.no_grad():
            logits = torch.matmul(self.hidden, self.weight.T)
        return logits.requires_grad_(True)


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


def _peaked_scale(probe_logits: torch.Tensor, target: float) -> float:
    """Scale s such that the mean entropy of softmax(s * logits) over the probe rows is `target`.

    The entropy of a softmax falls monotonically as its logits are scaled up, so bisect on log s.
    """
    lo, hi = 0.0, math.log(1e4)
    for _ in range(25):  # brackets s to a factor of 1.0003, far finer than the entropy target needs
        mid = (lo + hi) / 2
        if _entropy(probe_logits * math.exp(mid)).mean().item() > target:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def _sample_from_policy(hidden: torch.Tensor, weight: torch.Tensor,
                        gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token per row of hidden [N, H] from softmax(hidden @ weight.T), with its log-prob and the
    row's entropy; the logits are materialised a chunk of rows at a time."""
    N, V = hidden.shape[0], weight.shape[0]
    ids = torch.empty(N, dtype=torch.int64, device=hidden.device)
    logps = torch.empty(N, dtype=torch.float32, device=hidden.device)
    entropy = torch.empty(N, dtype=torch.float32, device=hidden.device)
    rows = max(1, _SAMPLING_ELEMENTS // V)
    for r0 in range(0, N, rows):
        log_p = torch.log_softmax((hidden[r0:r0 + rows] @ weight.T).float(), dim=-1)
        chosen = torch.multinomial(log_p.exp(), 1, generator=gen)
        ids[r0:r0 + rows] = chosen.squeeze(-1)
        logps[r0:r0 + rows] = log_p.gather(-1, chosen).squeeze(-1)
        entropy[r0:r0 + rows] = -(log_p.exp() * log_p).sum(-1)
    return ids, logps, entropy


def make_inputs(shape: BenchShape, regime: str, device: torch.device | str, seed: int = 0,
                sample_from_policy: bool = True) -> BenchInputs:
    """Build one case's inputs; the same (shape, regime, seed) gives the same tensors on a device.

    sample_from_policy=False draws the completion tokens uniformly instead (and takes -log V as the
    policy's log-probs): for memory-only measurements at large V, where sampling costs seconds on CPU.
    """
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {REGIMES}, got {regime!r}")
    device = torch.device(device)
    B, T, H, V = shape.batch, shape.seq_len, shape.head.hidden, shape.head.vocab
    gen = torch.Generator(device=device).manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=gen, device=device)
    weight = torch.randn(V, H, generator=gen, device=device) / math.sqrt(H)  # unit-variance logits

    scale = 1.0
    if regime == "peaked":
        probe = hidden.reshape(-1, H)[:_ENTROPY_PROBE_ROWS].to(shape.torch_dtype) @ weight.to(shape.torch_dtype).T
        scale = _peaked_scale(probe.float(), PEAKED_TARGET_ENTROPY)
        weight = weight * scale
    hidden = hidden.to(shape.torch_dtype)
    weight = weight.to(shape.torch_dtype)

    if sample_from_policy:
        ids, logps, entropy = _sample_from_policy(hidden.reshape(-1, H), weight, gen)
    else:
        ids = torch.randint(0, V, (B * T,), generator=gen, device=device)
        logps = torch.full((B * T,), -math.log(V), device=device)
        entropy = torch.full((B * T,), math.log(V), device=device)

    # Right-padded completions of random length in [T/2, T]; the first one is full length.
    lengths = torch.randint(T // 2, T + 1, (B,), generator=gen, device=device)
    lengths[0] = T
    mask = (torch.arange(T, device=device)[None, :] < lengths[:, None]).to(torch.int64)
    logps = logps.view(B, T)
    old_logps = (logps + _OLD_LOGPS_NOISE * torch.randn(B, T, generator=gen, device=device)).clamp(max=0.0)
    ref_logps = (logps + _REF_LOGPS_NOISE * torch.randn(B, T, generator=gen, device=device)).clamp(max=0.0)
    advantages = torch.randn(B, generator=gen, device=device)
    mean_entropy = (entropy.view(B, T) * mask).sum() / mask.sum()

    return BenchInputs(
        hidden=hidden.requires_grad_(True),
        weight=weight.requires_grad_(True),
        completion_ids=ids.view(B, T),
        completion_mask=mask,
        advantages=advantages,
        old_logps=old_logps,
        ref_logps=ref_logps,
        mean_entropy=float(mean_entropy),
        logit_scale=scale,
    )


def save_inputs(inputs: BenchInputs, path: str) -> None:
    """Write the tensors (detached) and scalars so a fresh process can rebuild the same inputs."""
    tensors = {name: getattr(inputs, name).detach() for name in
               ("hidden", "weight", "completion_ids", "completion_mask", "advantages", "old_logps", "ref_logps")}
    torch.save({"tensors": tensors, "mean_entropy": inputs.mean_entropy, "logit_scale": inputs.logit_scale}, path)


def load_inputs(path: str) -> BenchInputs:
    saved = torch.load(path, weights_only=True)
    tensors = saved["tensors"]
    tensors["hidden"].requires_grad_(True)
    tensors["weight"].requires_grad_(True)
    return BenchInputs(**tensors, mean_entropy=saved["mean_entropy"], logit_scale=saved["logit_scale"])
