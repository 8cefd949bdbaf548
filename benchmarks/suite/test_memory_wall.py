"""The memory wall: the largest N whose loss step (dapo, forward + backward) fits in GPU memory, per path.

N doubles from 4096 at the Qwen2.5-7B head in bf16 until the step runs out of memory (or the last size
is reached); the step at the largest N that fits is then timed. GPU only: on CPU it would only measure
the machine's swap.
"""

import pytest
import torch

from .cases import LOSS_CASES
from .inputs import make_inputs
from .paths import PATHS, PathUnavailable, check_available, make_loss_step
from .runner import is_out_of_memory
from .shapes import GPU_SEQ_LEN, MEMORY_WALL_HEAD, MEMORY_WALL_TOKENS, BenchShape


WALL_ROUNDS = 3


def _wall_shape(tokens: int) -> BenchShape:
    return BenchShape(MEMORY_WALL_HEAD, tokens // GPU_SEQ_LEN, GPU_SEQ_LEN, "bfloat16")


def _fits(path: str, shape: BenchShape) -> bool:
    torch.cuda.empty_cache()
    try:
        # Memory does not depend on the values: uniform tokens spare sampling a million rows.
        inputs = make_inputs(shape, "flat", "cuda", sample_from_policy=False)
        make_loss_step(path, inputs, LOSS_CASES["dapo"])()
        torch.cuda.synchronize()
        return True
    except (torch.cuda.OutOfMemoryError, RuntimeError) as error:
        if not is_out_of_memory(error):
            raise
        return False


@pytest.mark.parametrize("path", PATHS)
def test_memory_wall(benchmark, runner, path):
    if runner.device.type != "cuda":
        pytest.skip("the memory wall is measured on a CUDA device only")
    try:
        check_available(path, "loss", _wall_shape(MEMORY_WALL_TOKENS[-1]), runner.device)
    except PathUnavailable as reason:
        pytest.skip(f"{path}: {reason}")
    runner.inputs.release()  # the wall is about all of the device's memory
    largest = None
    for tokens in MEMORY_WALL_TOKENS:
        if not _fits(path, _wall_shape(tokens)):
            break
        largest = tokens
    if largest is None:
        pytest.skip(f"{path}: even N={MEMORY_WALL_TOKENS[0]} does not fit")
    benchmark.extra_info["max_tokens"] = largest
    benchmark.extra_info["hit_wall"] = largest != MEMORY_WALL_TOKENS[-1]
    benchmark.extra_info["wall_tokens_tried"] = list(MEMORY_WALL_TOKENS)
    # A step at a million tokens takes seconds: a few rounds time it well enough.
    runner.run(benchmark, "loss", _wall_shape(largest), "flat", "dapo", path, rounds=WALL_ROUNDS)
    benchmark.group = f"memory-wall | dapo | flat | {MEMORY_WALL_HEAD.name}"
    benchmark.extra_info["operation"] = "memory-wall"
