"""Vocabulary-parallel heads on CPU with gloo: 2 and 3 processes, V not divisible by the group size, targets on
every shard; loss, metrics, logps, dH and each rank's dW/dbias shard against the float64 reference on the whole
head, for the DTensor and the process_group forms, the gemm and torch backends (and triton, interpreted, on
2 processes); no buffer of [N, V] or [V, H]; bad inputs. Process start is the cost, so each spawned group runs
its whole suite (tests/support/vocab_parallel_worker.py), and a failure names the backend, configuration and form."""

import pytest
import torch
import torch.multiprocessing as mp
import vocab_parallel_worker

from grpo_kernels import linear_logprobs

pytestmark = pytest.mark.usefixtures("cpu_only_subprocesses")


def _spawn(tmp_path, world: int, suite: str) -> None:
    mp.spawn(vocab_parallel_worker.run, args=(world, str(tmp_path / "init"), suite), nprocs=world, join=True)


def test_two_processes_match_unsharded_reference_and_reject_bad_shards(tmp_path):
    _spawn(tmp_path, 2, "two_processes")


def test_three_processes_match_unsharded_reference(tmp_path):
    _spawn(tmp_path, 3, "three_processes")


def test_process_group_needs_torch_distributed():
    with pytest.raises(ValueError, match="process_group was given but torch.distributed is not initialised"):
        linear_logprobs(torch.randn(2, 4), torch.randn(5, 4), torch.zeros(2, dtype=torch.long), process_group=object())
