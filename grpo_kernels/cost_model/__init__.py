"""The cost model: what each of this library's paths costs on a GPU, from FLOPs, bytes and launches counted from
its algorithm and rates with their sources. `backend="auto"` routes by it (grpo_kernels/routing.py); the
benchmarks' roofline (`python -m benchmarks.roofline`) prints it beside the peers' models. Needs no GPU."""

from .device import DEVICES, DeviceRates, device_key, gemm_compute_seconds
from .estimate import GIB, ITEMSIZE, Estimate, Phase, Problem
from .paths import PER_TOKEN_BYTES, gemm_phase, padding_phases, waves
from ..backends import BACKENDS



def library_paths() -> dict:
    """The registered backends' models (each entry's `cost`), in the registry's order, read when asked: a backend
    registered after import is modelled too. One registered without a cost runs, but `auto` never routes to it and
    the roofline and the GPU plan model it as the baseline."""
    return {name: spec.cost_model() for name, spec in BACKENDS.items() if spec.cost is not None}

__all__ = ["DEVICES", "DeviceRates", "device_key", "gemm_compute_seconds", "GIB", "ITEMSIZE", "Estimate", "Phase",
           "Problem", "library_paths", "PER_TOKEN_BYTES", "gemm_phase", "padding_phases", "waves"]
