"""Vocabulary-parallel heads on CPU with gloo: 2 and 3 processes, V not divisible by the group size, targets on
every shard; loss, metrics, logps, dH and each rank's dW/dbias shard against the float64 reference on the whole
head, for the DTensor and the process_group forms (the cases run inside the spawned group:
tests/vocab_parallel_worker.py)."""

import pytest
import torch.multiprocessing as mp
import vocab_parallel_worker


def _spawn(tmp_path, world: int, suite: str) -> None:
    mp.spawn(vocab_parallel_worker.run, args=(world, str(tmp_path / "init"), suite), nprocs=world, join=True)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("suite", ["gemm", "torch"])
def test_sharded_head_matches_unsharded_reference(tmp_path, world, suite):
    _spawn(tmp_path, world, suite)


def test_sharded_head_triton_interpreter(tmp_path):
    _spawn(tmp_path, 2, "triton")


def test_bad_sharded_inputs_name_the_argument(tmp_path):
    _spawn(tmp_path, 2, "errors")


def test_process_group_needs_torch_distributed():
    import torch

    from grpo_kernels import linear_logprobs

    with pytest.raises(ValueError, match="process_group was given but torch.distributed is not initialised"):
        linear_logprobs(torch.randn(2, 4), torch.randn(5, 4), torch.zeros(2, dtype=torch.long), process_group=object())
