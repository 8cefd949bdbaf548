"""Peak extra memory of one step: what it allocates beyond its inputs, at its highest point.

GPU: `torch.cuda.max_memory_allocated()` minus the allocation before the step, in this process.
CPU: peak resident set size of a fresh process that loads the inputs, runs one warm-up step on a tiny
case, resets its peak-RSS counter and runs the step once; extra = peak RSS - RSS before the step.
Processes are forked from a server that has only imported the modules, so each measurement starts
from a clean heap without paying the torch import each time.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import ctypes
import ctypes.util
import gc
import multiprocessing
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .cases import LOSS_CASES
from .inputs import load_inputs, make_inputs
from .paths import make_floor_step, make_step
from .shapes import SHAPE_SETS

CPU_METHOD = "peak RSS of a fresh process (VmHWM reset after inputs are loaded)"
GPU_METHOD = "torch.cuda.max_memory_allocated minus allocated before the step"


@dataclass(frozen=True)
class ProbeRequest:
    """One CPU measurement: which step, on inputs saved by `save_inputs` at `inputs_path`."""
    path: str  # a path of benchmarks.suite.paths, or "floor"
    operation: str
    case_name: str  # a key of LOSS_CASES
    inputs_path: str
    threads: int  # torch threads, as in the timed run (per-thread buffers are part of the peak)


def gpu_peak_extra_bytes(step: Callable[[], object]) -> int:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = step()  # kept alive until the peak is read: the outputs (gradients) are part of the cost
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del result
    return peak - before


# ---- CPU: peak RSS in a forked child ----------------------------------------------------------------

def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _reset_peak_rss() -> None:
    # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def _glibc() -> Optional[ctypes.CDLL]:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc if libc is not None and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def _return_freed_memory_to_os() -> None:
    # Without this, pages freed by input loading and the warm-up stay resident and the measured step
    # could reuse them without raising RSS, hiding part of its peak.
    libc = _glibc()
    if libc is not None:
        M_MMAP_THRESHOLD = -3
        libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024)  # large blocks: mmap'd, unmapped on free (a fixed threshold)
        libc.malloc_trim(0)


def _build_step(request: ProbeRequest, inputs) -> Callable[[], object]:
    if request.path == "floor":
        return make_floor_step(request.operation, inputs)
    return make_step(request.path, request.operation, inputs, LOSS_CASES[request.case_name])


def _measure_in_child(request: ProbeRequest) -> dict:
    torch.set_num_threads(request.threads)
    _return_freed_memory_to_os()
    # Warm-up on the smoke shape: imports, lazy initialisation and the Triton interpreter's first launch
    # happen here, not in the measured step.
    tiny = make_inputs(SHAPE_SETS["smoke"][0], "flat", "cpu", seed=1)
    _build_step(request, tiny)()
    del tiny
    inputs = load_inputs(request.inputs_path)
    step = _build_step(request, inputs)  # logits-input cases build their logits here: an input, not extra
    gc.collect()
    _return_freed_memory_to_os()
    before_kib = _proc_status_kib("VmRSS")
    _reset_peak_rss()
    result = step()
    peak_kib = _proc_status_kib("VmHWM")
    del result
    return {"peak_extra_bytes": (peak_kib - before_kib) * 1024, "rss_before_bytes": before_kib * 1024}


# Imported once by the fork server (imports only, no torch ops, so the forks start clean). Besides this
# module: what the paths import lazily on their first step, which would otherwise cost every fork
# seconds (torch._dynamo via torch.library custom ops, the Triton kernels, Liger, TRL). Missing ones are skipped.
_PRELOAD = ("benchmarks.suite.memory", "torch._dynamo", "grpo_kernels.kernels.launch",
            "grpo_kernels.kernels.linear_forward", "grpo_kernels.kernels.linear_backward",
            "grpo_kernels.kernels.logits", "liger_kernel.chunked_loss", "liger_kernel.transformers.grpo_loss",
            "grpo_kernels.integrations.trl", "benchmarks.suite.trl_path")

_executor: Optional[concurrent.futures.ProcessPoolExecutor] = None


def _fresh_process_executor() -> concurrent.futures.ProcessPoolExecutor:
    global _executor
    if _executor is None:
        context = multiprocessing.get_context("forkserver")
        # The server imports torch and the package once; every measurement is a new fork of it.
        context.set_forkserver_preload(list(_PRELOAD))
        _executor = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context,
                                                           max_tasks_per_child=1)
        atexit.register(_executor.shutdown)
    return _executor


def cpu_peak_rss_supported() -> bool:
    try:
        _proc_status_kib("VmHWM")
        with open("/proc/self/clear_refs", "w"):
            pass
        return True
    except (OSError, RuntimeError):
        return False


def cpu_peak_extra_bytes(request: ProbeRequest) -> dict:
    """Run the request in a fresh process; {"peak_extra_bytes", "rss_before_bytes"}."""
    return _fresh_process_executor().submit(_measure_in_child, request).result()
