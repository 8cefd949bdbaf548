"""Vocabulary-parallel heads on CPU with gloo: 2 and 3 processes, V not divisible by the group size, targets on
every shard; loss, metrics, logps, dH and each rank's dW/dbias shard against the float64 reference on the whole
head, for the DTensor and the process_group forms, the gemm and torch backends (and triton, interpreted, on
2 processes); no buffer of [N, V] or [V, H]; bad inputs. Process start is the cost, so one spawned group per
world size computes every case (tests/support/vocab_parallel_worker.py) and saves what each rank got; the tests
here compare them, one test per case, every rank."""

import re
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp
import vocab_parallel_worker as worker
from grpo_testing import assert_grad_close, assert_loss_close, assert_output_matches

from grpo_kernels import linear_logprobs

# What each bad input must raise, on every rank (the worker's error cases, by name).
ERRORS = {
    "weight-sharded-on-dim-1": (ValueError, r"weight must be sharded on dim 0"),
    "dtensor-shards-sum-to-another-size": (
        ValueError, r"weight: the group's shard sizes .* sum to 67, but the DTensor weight has 72"),
    "process-group-with-dtensor": (ValueError, r"process_group must be None with a DTensor weight"),
    "plain-bias-with-dtensor-weight": (TypeError, r"bias must be a DTensor .*mixed DTensor/plain"),
    "dtensor-bias-with-plain-weight": (TypeError, r"bias is a DTensor but weight is not"),
    "dtensor-hidden": (TypeError, r"hidden must be a plain tensor"),
    "target-id-out-of-range": (ValueError, r"completion_ids must hold token ids in \[0, 67\)"),
    "hidden-size-differs-between-ranks": (ValueError, r"weight: the ranks' shards disagree on the hidden size"),
    "tokens-differ-between-ranks": (ValueError, r"hidden: every rank of the group must pass the same tokens"),
    "bias-shard-of-another-size": (ValueError, r"bias: each rank's bias shard must match"),
    "reference-backend": (ValueError, r"backend='reference'"),
    "a-rank-without-rows": (ValueError, r"weight: every rank of the group needs at least one vocabulary row"),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """suite -> the per-rank results, the group spawned on first use (CPU only: no GPU is visible to it)."""
    computed: dict[str, list[dict]] = {}

    def get(suite: str) -> list[dict]:
        if suite not in computed:
            world = worker.WORLD[suite]
            out = tmp_path_factory.mktemp(suite)
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("CUDA_VISIBLE_DEVICES", "")
                mp.spawn(worker.run, args=(world, str(out / "init"), suite, str(out)), nprocs=world, join=True)
            computed[suite] = [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(world)]
        return computed[suite]

    return get


def check(result: dict, rank: int) -> None:
    """The comparisons of one case on one rank, each naming what it compares."""
    kind = result["kind"]
    if kind == "crashed":
        pytest.fail(f"rank {rank} raised:\n{result['traceback']}")
    if kind == "loss":
        out, ref = SimpleNamespace(**result["out"]), SimpleNamespace(**result["ref_out"])
        assert_output_matches(out, result["grads"], ref, result["ref_grads"], result["dtype"])
    elif kind == "logprobs":
        for name in ("logps", "entropy"):
            torch.testing.assert_close(result[name].double(), result[f"ref_{name}"], atol=1e-5, rtol=1e-5, msg=name)
        assert set(result["grads"]) == set(result["ref_grads"]) == {"hidden", "weight", "bias"}
        for name, expected in result["ref_grads"].items():
            assert_grad_close(result["grads"][name], expected, torch.float32, f"d{name}")
    elif kind == "module":
        assert_loss_close(result["loss"], result["ref_loss"], torch.float32)
        for name, expected in result["ref_grads"].items():
            assert_grad_close(result["grads"][name], expected, torch.float32, f"d{name}")
    elif kind == "buffers":
        shape = worker.BUFFER_SHAPE
        limit = min(shape["B"] * shape["T"] * shape["V"], shape["V"] * shape["H"])
        assert result["largest"] < limit, f"a {result['largest']}-element buffer (N*V, V*H >= {limit})"
        assert result["reference_largest"] >= limit, "the spy did not see the reference's [N, V] logits"
    else:
        raise AssertionError(f"unknown result kind {kind!r}")


def _check_every_rank(results, suite: str, case: str) -> None:
    ranks = results(suite)
    for rank, per_rank in enumerate(ranks):
        assert case in per_rank, f"rank {rank} has no result for {case}"
        try:
            check(per_rank[case], rank)
        except AssertionError as error:
            raise AssertionError(f"rank {rank} of {len(ranks)}: {error}") from error


TWO = [name for name in worker.suite_cases("two_processes") if not name.startswith("error-")]
THREE = list(worker.suite_cases("three_processes"))


@pytest.mark.slow
@pytest.mark.parametrize("case", TWO)
def test_two_processes_match_the_unsharded_float64_reference(results, case):
    _check_every_rank(results, "two_processes", case)


@pytest.mark.slow
@pytest.mark.parametrize("case", THREE)
def test_three_processes_match_the_unsharded_float64_reference(results, case):
    _check_every_rank(results, "three_processes", case)


def test_every_bad_input_has_its_expected_error():
    assert {name for name in worker.suite_cases("two_processes") if name.startswith("error-")} == {
        f"error-{name}" for name in ERRORS}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_shards_are_rejected_on_every_rank(results, case):
    error, pattern = ERRORS[case]
    for rank, per_rank in enumerate(results("two_processes")):
        raised = per_rank[f"error-{case}"]
        assert raised["kind"] == "error", raised.get("traceback", raised)
        assert raised["raised"] is not None, f"rank {rank}: nothing raised"
        name, message = raised["raised"]
        assert name == error.__name__ and re.search(pattern, message), f"rank {rank}: {name}: {message}"


def test_process_group_needs_torch_distributed():
    with pytest.raises(ValueError, match="process_group was given but torch.distributed is not initialised"):
        linear_logprobs(torch.randn(2, 4), torch.randn(5, 4), torch.zeros(2, dtype=torch.long), process_group=object())
