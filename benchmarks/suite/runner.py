"""Runs one benchmark case: skip if the path cannot run it, time it, measure its memory, record it all."""

from __future__ import annotations

import os
import statistics
import tempfile
from typing import Callable, Optional

import pytest
import torch

from . import memory
from .cases import LOSS_CASES, flops
from .inputs import BenchInputs, make_inputs, save_inputs
from .paths import PathUnavailable, check_available, make_floor_step, make_step, valid_tokens
from .shapes import BenchShape


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


class InputsCache:
    """The inputs of the current (shape, regime), kept while consecutive cases reuse them.

    The suite orders cases by (shape, regime) so one entry suffices; GPU-set inputs are gigabytes.
    On CPU the inputs are also saved to a file, for the fresh processes that measure peak RSS.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._key: Optional[tuple] = None
        self._inputs: Optional[BenchInputs] = None
        self._file: Optional[str] = None
        self._dir = tempfile.TemporaryDirectory(prefix="grpo-bench-")

    def get(self, shape: BenchShape, regime: str) -> tuple[BenchInputs, Optional[str]]:
        key = (shape, regime)
        if key != self._key:
            self.release()  # free the previous inputs before building the next
            self._inputs = make_inputs(shape, regime, self.device)
            self._key = key
            self._file = None
            if self.device.type == "cpu":
                self._file = os.path.join(self._dir.name, "inputs.pt")
                save_inputs(self._inputs, self._file)
        return self._inputs, self._file

    def release(self) -> None:
        """Drop the held inputs (before a case that needs all the device memory)."""
        self._key, self._inputs, self._file = None, None, None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def close(self) -> None:
        self.release()
        self._dir.cleanup()


class BenchRunner:
    def __init__(self, device: torch.device, rounds: int, warmup_rounds: int, measure_memory: bool):
        self.device = device
        self.rounds = rounds
        self.warmup_rounds = warmup_rounds
        self.measure_memory = measure_memory
        self.inputs = InputsCache(device)

    def _time(self, benchmark, step: Callable[[], object], rounds: int) -> Optional[float]:
        """pytest-benchmark's timing (synchronised on GPU); returns the CUDA-event median in ms on GPU."""
        if self.device.type != "cuda":
            benchmark.pedantic(step, rounds=rounds, warmup_rounds=self.warmup_rounds, iterations=1)
            return None
        event_ms: list[float] = []

        def timed():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = step()
            end.record()
            end.synchronize()
            event_ms.append(start.elapsed_time(end))
            return result

        benchmark.pedantic(timed, rounds=rounds, warmup_rounds=self.warmup_rounds, iterations=1)
        measured = event_ms[self.warmup_rounds:]
        return statistics.median(measured) if measured else None

    def _memory(self, step: Callable[[], object], request: memory.ProbeRequest) -> dict:
        if not self.measure_memory:
            return {}
        if self.device.type == "cuda":
            return {"peak_extra_bytes": memory.gpu_peak_extra_bytes(step), "memory_method": memory.GPU_METHOD}
        if not memory.cpu_peak_rss_supported():
            return {"memory_method": "unavailable: needs Linux /proc/self/status VmHWM and clear_refs"}
        return {**memory.cpu_peak_extra_bytes(request), "memory_method": memory.CPU_METHOD}

    def run(self, benchmark, operation: str, shape: BenchShape, regime: str, case_name: str, path: str,
            rounds: Optional[int] = None) -> None:
        """One case; `path` "floor" runs the bare-GEMM floor of `operation`; `rounds` overrides the default."""
        try:
            if path != "floor":
                check_available(path, operation, shape, self.device)
        except PathUnavailable as reason:
            pytest.skip(f"{path}: {reason}")
        benchmark.group = f"{operation} | {case_name} | {regime} | {shape.id}"
        benchmark.extra_info.update({
            "path": path, "operation": operation, "config": case_name, "regime": regime,
            "head": shape.head.name, "hidden": shape.head.hidden, "vocab": shape.head.vocab,
            "tokens": shape.tokens, "batch": shape.batch, "seq_len": shape.seq_len, "dtype": shape.dtype,
            "device": self.device.type, "flops": flops(operation, shape.tokens, shape.head.hidden, shape.head.vocab),
        })
        step = None
        out_of_memory = None
        try:
            inputs, inputs_file = self.inputs.get(shape, regime)
            benchmark.extra_info.update({"mean_entropy": inputs.mean_entropy, "logit_scale": inputs.logit_scale,
                                         "valid_tokens": valid_tokens(inputs, case_name)})
            if path == "floor":
                step = make_floor_step(operation, inputs)
            else:
                step = make_step(path, operation, inputs, LOSS_CASES[case_name])
            cuda_median_ms = self._time(benchmark, step, rounds or self.rounds)
            if cuda_median_ms is not None:
                benchmark.extra_info["cuda_event_median_ms"] = cuda_median_ms
            request = memory.ProbeRequest(path, operation, case_name, inputs_file or "", torch.get_num_threads())
            benchmark.extra_info.update(self._memory(step, request))
        except PathUnavailable as reason:
            pytest.skip(f"{path}: {reason}")
        except (torch.cuda.OutOfMemoryError, RuntimeError) as error:
            if not is_out_of_memory(error):
                raise
            out_of_memory = str(error).splitlines()[0][:200]
        if out_of_memory is not None:
            # Skip only after the step's tensors are released: the skip's traceback keeps this frame alive.
            step = None
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            pytest.skip(f"{path}: out of memory at N={shape.tokens} ({out_of_memory})")

    def close(self) -> None:
        self.inputs.close()
