"""One rank of a gloo group on CPU running many vocabulary-parallel cases against the float64 reference on the
unsharded head (process start is the cost, so each spawned group runs a whole suite). Used by
tests/grpo_kernels/test_vocab_parallel.py through torch.multiprocessing; an assertion in any rank fails the test."""

from __future__ import annotations

import functools
import os
from typing import Callable, Optional

import torch
import torch.distributed as dist
from grpo_testing import (as_float64, assert_grad_close, assert_loss_close, assert_output_matches, kept_sets,
                          make_problem)
from test_api import CONFIGS, head_kwargs  # every loss type, option and head transform of the parity tests

from grpo_kernels import (FusedLinearGRPOLoss, GRPOLossConfig, LogitTransform, fused_linear_grpo_loss,
                          linear_logprobs, reference)


def uneven_sizes(V: int, world: int) -> list[int]:
    """Shard sizes that differ from rank to rank (the first ranks get fewer rows) and sum to V."""
    base = V // world
    sizes = [base - 1] * (world - 1)
    return sizes + [V - sum(sizes)]


def gathered_sizes(local_rows: int) -> list[int]:
    sizes: list = [None] * dist.get_world_size()
    dist.all_gather_object(sizes, local_rows)
    return sizes


def targets_on_every_shard(problem, sizes: list[int]) -> None:
    """Put one completion token in each rank's shard (in the first sequence, which is never masked out)."""
    starts = [sum(sizes[:r]) for r in range(len(sizes))]
    for r, (start, size) in enumerate(zip(starts, sizes)):
        problem.completion_ids[0, r % problem.completion_ids.shape[1]] = start + size // 2
        problem.completion_mask[0, r % problem.completion_ids.shape[1]] = 1


@functools.lru_cache(maxsize=None)
def cpu_mesh(world: int):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world,))


class ShardedHead:
    """This rank's view of the head in one of the two forms, as fresh leaves; `grads()` gives its shard's."""

    def __init__(self, form: str, weight: torch.Tensor, bias: Optional[torch.Tensor]):
        world, rank = dist.get_world_size(), dist.get_rank()
        self.form = form
        if form == "dtensor":
            from torch.distributed.tensor import Shard, distribute_tensor

            mesh = cpu_mesh(world)
            self.weight = distribute_tensor(weight.detach(), mesh, [Shard(0)]).requires_grad_()
            self.bias = None if bias is None else distribute_tensor(bias.detach(), mesh, [Shard(0)]).requires_grad_()
            self.sizes = gathered_sizes(self.weight.to_local().shape[0])
            self.kwargs: dict = {}
        else:
            self.sizes = uneven_sizes(weight.shape[0], world)
            rows = self.rows()
            self.weight = weight.detach()[rows].clone().requires_grad_()
            self.bias = None if bias is None else bias.detach()[rows].clone().requires_grad_()
            self.kwargs = dict(process_group=dist.group.WORLD)

    def rows(self) -> slice:
        rank = dist.get_rank()
        start = sum(self.sizes[:rank])
        return slice(start, start + self.sizes[rank])

    def grads(self) -> dict:
        def local(x):
            return None if x is None or x.grad is None else (x.grad.to_local() if self.form == "dtensor" else x.grad)
        return {"weight": local(self.weight), "bias": local(self.bias)}


def sharded_loss(problem, config, form: str, backend: str, **kwargs):
    head = ShardedHead(form, problem.weight, problem.bias)
    hidden = problem.hidden.detach().clone().requires_grad_()
    kw = problem.loss_kwargs()
    kw["bias"] = head.bias
    out = fused_linear_grpo_loss(hidden, head.weight, problem.completion_ids, problem.completion_mask,
                                 problem.advantages, config=config, backend=backend, **kw, **head.kwargs, **kwargs)
    out.loss.backward()
    grads = {"hidden": hidden.grad, **head.grads()}
    return out, {k: v for k, v in grads.items() if v is not None}, head


def reference_loss(problem, config, head: ShardedHead, logit_transform=None, kept_token_ids=None):
    leaves = {name: getattr(as_float64(problem), name).clone().requires_grad_()
              for name in ("hidden", "weight", "bias") if getattr(problem, name) is not None}
    p64 = as_float64(problem)
    kw = p64.loss_kwargs()
    kw["bias"] = leaves.get("bias")
    out = reference.fused_linear_grpo_loss(leaves["hidden"], leaves["weight"], p64.completion_ids,
                                           p64.completion_mask, p64.advantages, config=config,
                                           logit_transform=logit_transform, kept_token_ids=kept_token_ids, **kw)
    out.loss.backward()
    rows = head.rows()
    grads = {"hidden": leaves["hidden"].grad, "weight": leaves["weight"].grad[rows]}
    if "bias" in leaves:
        grads["bias"] = leaves["bias"].grad[rows]
    return out, grads


def check_loss(problem, config, form: str, backend: str, dtype: torch.dtype = torch.float32, logit_transform=None,
               **kwargs) -> None:
    out, grads, head = sharded_loss(problem, config, form, backend, logit_transform=logit_transform, **kwargs)
    ref_out, ref_grads = reference_loss(problem, config, head, logit_transform, kwargs.get("kept_token_ids"))
    assert_output_matches(out, grads, ref_out, ref_grads, dtype)


def check_linear_logprobs(problem, form: str, backend: str, logit_transform=None) -> None:
    head = ShardedHead(form, problem.weight, problem.bias)
    hidden = problem.hidden.detach().clone().requires_grad_()
    lp, ent = linear_logprobs(hidden, head.weight, problem.completion_ids, bias=head.bias, temperature=0.8,
                              return_entropy=True, backend=backend, logit_transform=logit_transform, **head.kwargs)
    (lp.sum() + 0.3 * ent.sum()).backward()
    p64 = as_float64(problem)
    leaves = [p64.hidden.requires_grad_(), p64.weight.requires_grad_(), p64.bias.requires_grad_()]
    ref_lp, ref_ent = reference.linear_logprobs(*leaves[:2], p64.completion_ids, bias=leaves[2], temperature=0.8,
                                                return_entropy=True, logit_transform=logit_transform)
    (ref_lp.sum() + 0.3 * ref_ent.sum()).backward()
    for name, a, e in (("logps", lp, ref_lp), ("entropy", ent, ref_ent)):
        torch.testing.assert_close(a.detach().double(), e.detach(), atol=1e-5, rtol=1e-5, msg=name)
    rows = head.rows()
    assert_grad_close(hidden.grad, leaves[0].grad, torch.float32, "dhidden")
    for name, grad in head.grads().items():
        assert_grad_close(grad, dict(weight=leaves[1], bias=leaves[2])[name].grad[rows], torch.float32, f"d{name}")


def check_module(problem, backend: str) -> None:
    # Stated for both: the module's default is Liger's (False), GRPOLossConfig's is TRL's (True).
    config = dict(beta=0.04, loss_type="grpo", use_bias_correction_kl=False)
    head = ShardedHead("group", problem.weight, problem.bias)
    hidden = problem.hidden.detach().clone().requires_grad_()
    module = FusedLinearGRPOLoss(**config, backend=backend, process_group=dist.group.WORLD)
    loss, _ = module(hidden, head.weight, problem.completion_ids, problem.completion_mask, problem.advantages,
                     bias=head.bias, ref_per_token_logps=problem.ref_logps, old_per_token_logps=problem.old_logps)
    loss.backward()
    ref_out, ref_grads = reference_loss(problem, GRPOLossConfig(**config), head)
    assert_loss_close(loss, ref_out.loss, torch.float32)
    assert_grad_close(hidden.grad, ref_grads["hidden"], torch.float32, "dhidden")
    assert_grad_close(head.weight.grad, ref_grads["weight"], torch.float32, "dweight")


def largest_new_tensor(fn: Callable[[], object]) -> int:
    """Elements of the largest buffer any op allocates while fn runs (views and out= writes reuse their
    input's storage and are not counted)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class RecordSizes(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            tensors = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
            inputs = {x.untyped_storage().data_ptr() for x in tensors}
            for x in tree_leaves(out):
                if isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() not in inputs:
                    self.largest = max(self.largest, x.untyped_storage().nbytes() // x.element_size())
            return out

    recorder = RecordSizes()
    with recorder:
        fn()
    return recorder.largest


def check_no_tokens_by_vocab_buffer(backend: str) -> None:
    """Every buffer the sharded forward+backward allocates is smaller than [N, V] and [V, H]: with N = H and
    V split in two, the largest legitimate ones (the local workspace [N, V_local], the local dW [V_local, H])
    are about half of either."""
    B, T, H, V = 4, 8, 32, 301
    problem = make_problem(seed=5, B=B, T=T, H=H, V=V)
    problem.completion_mask.fill_(1)
    limit = min(B * T * V, V * H)
    for config in (GRPOLossConfig(beta=0.04), GRPOLossConfig(importance_sampling_level="sequence", loss_type="grpo")):
        largest = largest_new_tensor(lambda: sharded_loss(problem, config, "group", backend))
        assert largest < limit, f"{backend}: a {largest}-element buffer (N*V, V*H >= {limit})"
        # the spy sees the unsharded head's [N, V] logits in the reference
        assert largest_new_tensor(lambda: reference.linear_logits(problem.hidden, problem.weight, None)) >= limit


# ---- suites: one per spawned group --------------------------------------------------------------------------

def parity_suite(backends: tuple[str, ...]) -> None:
    world = dist.get_world_size()
    V = 67 if world == 2 else 100  # not divisible by the group size
    for backend in backends:
        for i, (name, kwargs) in enumerate(CONFIGS.items()):
            config = GRPOLossConfig(**kwargs)
            rho = "token" if "rho" in name or name == "vespo" else None
            problem = make_problem(seed=100 + i, V=V, importance_ratio=rho)
            for form in ("group", "dtensor"):
                head_sizes = ShardedHead(form, problem.weight, None).sizes
                targets_on_every_shard(problem, head_sizes)
                try:
                    check_loss(problem, config, form, backend, **head_kwargs(name))
                except AssertionError as error:
                    raise AssertionError(f"{backend} {name} {form}: {error}") from error
        problem = make_problem(seed=7, V=V)
        for form in ("group", "dtensor"):
            check_linear_logprobs(problem, form, backend)
            # kept-token sets whose ids fall on every shard, and sets with no id on some rank (soft-capped head)
            for size in (2, 12):
                check_loss(problem, GRPOLossConfig(beta=0.04, entropy_coef=0.02), form, backend,
                           logit_transform=LogitTransform(scale=0.7, softcap=2.0),
                           kept_token_ids=kept_sets(problem.completion_ids, V, size, seed=size))
        check_linear_logprobs(problem, "group", backend, LogitTransform(scale=0.7, softcap=2.0))
        check_module(problem, backend)
        check_no_tokens_by_vocab_buffer(backend)
        # bfloat16 and a wave of a few tokens (several per-wave combines in the GEMM one-pass route)
        problem = make_problem(seed=8, V=V, dtype=torch.bfloat16)
        check_loss(problem, GRPOLossConfig(beta=0.04, entropy_coef=0.02), "group", backend, torch.bfloat16,
                   workspace_bytes=4 * 4 * V)


def triton_suite() -> None:
    problem = make_problem(seed=3, B=2, T=3, H=16, V=37)
    for config in (GRPOLossConfig(beta=0.04), GRPOLossConfig(importance_sampling_level="sequence", loss_type="grpo")):
        check_loss(problem, config, "group", "triton")
    check_loss(problem, GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence", entropy_coef=0.02),
               "group", "triton", logit_transform=LogitTransform(scale=1.5, softcap=2.0))


def error_suite() -> None:
    import pytest
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    world, rank = dist.get_world_size(), dist.get_rank()
    V = 67
    problem = make_problem(seed=9, V=V)
    mesh = cpu_mesh(world)
    B, T, H = problem.hidden.shape
    group = dist.group.WORLD
    head = ShardedHead("group", problem.weight, problem.bias)
    dt_weight = distribute_tensor(problem.weight, mesh, [Shard(0)])
    dt_bias = distribute_tensor(problem.bias, mesh, [Shard(0)])

    def loss(hidden=problem.hidden, weight=head.weight, bias=head.bias, ids=problem.completion_ids, **kwargs):
        kwargs.setdefault("process_group", group)
        return fused_linear_grpo_loss(hidden, weight, ids, problem.completion_mask, problem.advantages, bias=bias,
                                      **kwargs)

    with pytest.raises(ValueError, match=r"weight must be sharded on dim 0"):
        loss(weight=distribute_tensor(problem.weight, mesh, [Shard(1)]), bias=None, process_group=None)
    wrong_total = DTensor.from_local(dt_weight.to_local(), mesh, [Shard(0)], shape=(V + 5, H), stride=(H, 1))
    with pytest.raises(ValueError, match=r"weight: the group's shard sizes .* sum to 67, but the DTensor weight "
                                         r"has 72"):
        loss(weight=wrong_total, bias=None, process_group=None)
    with pytest.raises(ValueError, match=r"process_group must be None with a DTensor weight"):
        loss(weight=dt_weight, bias=dt_bias)
    with pytest.raises(TypeError, match=r"bias must be a DTensor .*mixed DTensor/plain"):
        loss(weight=dt_weight, bias=head.bias, process_group=None)
    with pytest.raises(TypeError, match=r"bias is a DTensor but weight is not"):
        loss(bias=dt_bias)
    with pytest.raises(TypeError, match=r"hidden must be a plain tensor"):
        loss(hidden=distribute_tensor(problem.hidden, mesh, [Shard(0)]))
    with pytest.raises(ValueError, match=r"completion_ids must hold token ids in \[0, 67\)"):
        loss(ids=torch.full_like(problem.completion_ids, V))
    with pytest.raises(ValueError, match=r"weight: the ranks' shards disagree on the hidden size"):
        wide = torch.randn(head.weight.shape[0], H + rank)
        loss(hidden=torch.randn(B, T, H + rank), weight=wide, bias=None)
    with pytest.raises(ValueError, match=r"hidden: every rank of the group must pass the same tokens"):
        loss(hidden=problem.hidden[: B - rank], ids=problem.completion_ids[: B - rank])
    with pytest.raises(ValueError, match=r"bias: each rank's bias shard must match"):
        loss(bias=problem.bias[: head.weight.shape[0] + rank])
    with pytest.raises(ValueError, match=r"backend='reference'"):
        loss(backend="reference")
    with pytest.raises(ValueError, match=r"weight: every rank of the group needs at least one vocabulary row"):
        linear_logprobs(problem.hidden, problem.weight[:rank * V], problem.completion_ids % 1, process_group=group)


def two_process_suite() -> None:
    parity_suite(("gemm", "torch"))
    triton_suite()
    error_suite()


SUITES: dict[str, Callable[[], None]] = {
    "two_processes": two_process_suite,
    "three_processes": lambda: parity_suite(("gemm", "torch")),
}


def run(rank: int, world: int, init_file: str, suite: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        SUITES[suite]()
    finally:
        dist.destroy_process_group()
