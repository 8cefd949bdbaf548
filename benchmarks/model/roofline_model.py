"""The roofline model's vocabulary, which lives in the library (grpo_kernels/cost_model/): `backend="auto"`
routes by the same model the benchmarks print, so there is one model, not two.

Predicted time = sum over phases of max(arithmetic time at the GEMM's shape, HBM bytes / HBM bandwidth, L2 reads /
L2 read rate + L2 atomics / L2 atomic rate) plus each phase's kernel launches and host synchronisations
(grpo_kernels/cost_model/device.py says what the GPU charges and where each number comes from).
"""

from __future__ import annotations

from grpo_kernels.cost_model import DEVICES, GIB, ITEMSIZE, DeviceRates, Estimate, Phase, Problem, device_key
from grpo_kernels.cost_model.device import MIB

__all__ = ["DEVICES", "GIB", "ITEMSIZE", "MIB", "DeviceRates", "Estimate", "Phase", "Problem", "device_key"]
