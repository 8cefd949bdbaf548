"""The loss step (forward + backward) with the LM head's vocabulary split over TP_WORLD ranks, against the
same step on the whole head in one process; same inputs, same backend. The sharded rows run in the group of
vocab_parallel_group.py (gloo on CPU, NCCL with one GPU per rank on CUDA), timed on rank 0.

On CPU each rank is one process with the suite's torch threads, so the sharded step uses TP_WORLD times the
cores of the unsharded one; its time is what a rank spends, the collectives included."""

import pytest
import torch

from .vocab_parallel_group import TP_WORLD, ShardGroup, make_step

SHARDINGS = ("unsharded", f"tp{TP_WORLD}")
BACKENDS = ("gemm", "torch")
CASES = ("dapo", "gspo")  # the GEMM one-pass route (token level) and the two-step route (sequence level)
REGIME = "flat"


@pytest.fixture(scope="module")
def shard_group(runner):
    if runner.device.type == "cuda" and torch.cuda.device_count() < TP_WORLD:
        pytest.skip(f"the sharded step needs {TP_WORLD} GPUs, this machine has {torch.cuda.device_count()}")
    group = ShardGroup(runner.device.type)
    yield group
    group.close()


@pytest.mark.parametrize("sharding", SHARDINGS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case_name", CASES)
def test_vocab_parallel_loss(benchmark, runner, shard_group, shape, case_name, backend, sharding):
    benchmark.group = f"vocab-parallel loss | {case_name} | {backend} | {shape.id}"
    benchmark.extra_info.update({
        "vocab_parallel": sharding, "world_size": TP_WORLD if sharding != "unsharded" else 1, "backend": backend,
        "config": case_name, "regime": REGIME, "head": shape.head.name, "hidden": shape.head.hidden,
        "vocab": shape.head.vocab, "tokens": shape.tokens, "dtype": shape.dtype, "device": runner.device.type})
    if sharding == "unsharded":
        step = make_step(shape, REGIME, case_name, backend, shard_group.device, sharded=False)
    else:
        step = shard_group.sharded_step(shape, REGIME, case_name, backend)
    cuda_median_ms = runner._time(benchmark, step, runner.rounds)
    if cuda_median_ms is not None:
        benchmark.extra_info["cuda_event_median_ms"] = cuda_median_ms
