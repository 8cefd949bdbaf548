"""One rank of a gloo group on CPU computing vocabulary-parallel cases and, for each, what the float64 reference
on the unsharded head gives (process start is the cost, so one spawned group computes a whole suite). Nothing is
asserted here: each rank saves its results, and tests/grpo_kernels/test_vocab_parallel.py compares them case by
case, so a failure names its case (backend, configuration, form) and the comparison that failed."""

from __future__ import annotations

import functools
import os
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from grpo_testing import as_float64, kept_sets, make_problem
from loss_configs import CONFIGS, head_kwargs, importance_ratio_kind
from processes import leave_spawned_process

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


def _output(out) -> dict:
    """A loss output as plain detached CPU tensors (what is saved)."""
    return {"loss": out.loss.detach().cpu(), "metrics": {k: v.detach().cpu() for k, v in out.metrics.items()},
            "logps": out.logps.detach().cpu()}


def _cpu(tensors: dict) -> dict:
    return {name: value.detach().cpu() for name, value in tensors.items()}


def loss_case(problem, config, form: str, backend: str, dtype: torch.dtype = torch.float32, logit_transform=None,
              **kwargs) -> dict:
    out, grads, head = sharded_loss(problem, config, form, backend, logit_transform=logit_transform, **kwargs)
    ref_out, ref_grads = reference_loss(problem, config, head, logit_transform, kwargs.get("kept_token_ids"))
    return {"kind": "loss", "dtype": dtype, "out": _output(out), "grads": _cpu(grads), "ref_out": _output(ref_out),
            "ref_grads": _cpu(ref_grads)}


def logprobs_case(problem, form: str, backend: str, logit_transform=None) -> dict:
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
    rows = head.rows()
    return {"kind": "logprobs", "logps": lp.detach(), "entropy": ent.detach(), "ref_logps": ref_lp.detach(),
            "ref_entropy": ref_ent.detach(), "grads": _cpu({"hidden": hidden.grad, **head.grads()}),
            "ref_grads": _cpu({"hidden": leaves[0].grad, "weight": leaves[1].grad[rows],
                               "bias": leaves[2].grad[rows]})}


def module_case(problem, backend: str) -> dict:
    # Stated for both: the module's default is Liger's (False), GRPOLossConfig's is TRL's (True).
    config = dict(beta=0.04, loss_type="grpo", use_bias_correction_kl=False)
    head = ShardedHead("group", problem.weight, problem.bias)
    hidden = problem.hidden.detach().clone().requires_grad_()
    module = FusedLinearGRPOLoss(**config, backend=backend, process_group=dist.group.WORLD)
    loss, _ = module(hidden, head.weight, problem.completion_ids, problem.completion_mask, problem.advantages,
                     bias=head.bias, ref_per_token_logps=problem.ref_logps, old_per_token_logps=problem.old_logps)
    loss.backward()
    ref_out, ref_grads = reference_loss(problem, GRPOLossConfig(**config), head)
    return {"kind": "module", "loss": loss.detach(), "ref_loss": ref_out.loss.detach(),
            "grads": _cpu({"hidden": hidden.grad, "weight": head.weight.grad}),
            "ref_grads": _cpu({"hidden": ref_grads["hidden"], "weight": ref_grads["weight"]})}


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


# N = H, and V split in two: the largest legitimate buffers (the local workspace [N, V_local], the local dW
# [V_local, H]) are about half of [N, V] or [V, H].
BUFFER_SHAPE = dict(B=4, T=8, H=32, V=301)


def buffers_case(backend: str, config: GRPOLossConfig) -> dict:
    """The largest buffer of the sharded forward + backward, and of the reference's logits (which the spy must
    see: it is [N, V])."""
    problem = make_problem(seed=5, **BUFFER_SHAPE)
    problem.completion_mask.fill_(1)
    return {"kind": "buffers", "largest": largest_new_tensor(lambda: sharded_loss(problem, config, "group", backend)),
            "reference_largest": largest_new_tensor(
                lambda: reference.linear_logits(problem.hidden, problem.weight, None))}


def error_case(call: Callable[[], object]) -> dict:
    """What a bad call raised on this rank: (exception type name, message), or None."""
    try:
        call()
    except Exception as error:  # the test compares type and message with what it expects
        return {"kind": "error", "raised": (type(error).__name__, str(error))}
    return {"kind": "error", "raised": None}


# ---- the cases of each suite, by name -------------------------------------------------------------------------

def parity_cases(world: int, backends: tuple[str, ...]) -> dict[str, Callable[[], dict]]:
    V = 67 if world == 2 else 100  # not divisible by the group size
    cases: dict[str, Callable[[], dict]] = {}

    def config_case(i: int, name: str, form: str, backend: str) -> Callable[[], dict]:
        def case() -> dict:
            problem = make_problem(seed=100 + i, V=V, importance_ratio=importance_ratio_kind(name))
            targets_on_every_shard(problem, ShardedHead(form, problem.weight, None).sizes)
            return loss_case(problem, GRPOLossConfig(**CONFIGS[name]), form, backend, **head_kwargs(name))
        return case

    def kept_case(form: str, backend: str, size: int) -> Callable[[], dict]:
        # kept-token sets whose ids fall on every shard (12), and sets with no id on some rank (2); soft-capped
        def case() -> dict:
            problem = make_problem(seed=7, V=V)
            return loss_case(problem, GRPOLossConfig(beta=0.04, entropy_coef=0.02), form, backend,
                             logit_transform=LogitTransform(scale=0.7, softcap=2.0),
                             kept_token_ids=kept_sets(problem.completion_ids, V, size, seed=size))
        return case

    def bf16_case(backend: str) -> Callable[[], dict]:
        # bfloat16 and a wave of a few tokens (several per-wave combines in the GEMM one-pass route)
        def case() -> dict:
            return loss_case(make_problem(seed=8, V=V, dtype=torch.bfloat16),
                             GRPOLossConfig(beta=0.04, entropy_coef=0.02), "group", backend, torch.bfloat16,
                             workspace_bytes=4 * 4 * V)
        return case

    softcap = LogitTransform(scale=0.7, softcap=2.0)
    for backend in backends:
        for i, name in enumerate(CONFIGS):
            for form in ("group", "dtensor"):
                cases[f"{backend}-{name}-{form}"] = config_case(i, name, form, backend)
        for form in ("group", "dtensor"):
            cases[f"{backend}-logprobs-{form}"] = functools.partial(
                lambda f, b: logprobs_case(make_problem(seed=7, V=V), f, b), form, backend)
            for size in (2, 12):
                cases[f"{backend}-kept{size}-softcap-{form}"] = kept_case(form, backend, size)
        cases[f"{backend}-logprobs-softcap-group"] = functools.partial(
            lambda b: logprobs_case(make_problem(seed=7, V=V), "group", b, softcap), backend)
        cases[f"{backend}-module-group"] = functools.partial(lambda b: module_case(make_problem(seed=7, V=V), b),
                                                             backend)
        for label, config in (("token", GRPOLossConfig(beta=0.04)),
                              ("sequence", GRPOLossConfig(importance_sampling_level="sequence", loss_type="grpo"))):
            cases[f"{backend}-buffers-{label}"] = functools.partial(buffers_case, backend, config)
        cases[f"{backend}-bfloat16-small-wave-group"] = bf16_case(backend)
    return cases


def triton_cases() -> dict[str, Callable[[], dict]]:
    def problem():
        return make_problem(seed=3, B=2, T=3, H=16, V=37)

    return {
        "triton-dapo_kl-group": lambda: loss_case(problem(), GRPOLossConfig(beta=0.04), "group", "triton"),
        "triton-gspo-group": lambda: loss_case(
            problem(), GRPOLossConfig(importance_sampling_level="sequence", loss_type="grpo"), "group", "triton"),
        "triton-gspo-entropy-scale-softcap-group": lambda: loss_case(
            problem(), GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence", entropy_coef=0.02),
            "group", "triton", logit_transform=LogitTransform(scale=1.5, softcap=2.0)),
        # the opt-in one-kernel backward on each rank's shard, with the whole vocabulary's statistics
        "triton_atomic-dapo_kl-entropy-scale-softcap-group": lambda: loss_case(
            problem(), GRPOLossConfig(beta=0.04, entropy_coef=0.02), "group", "triton_atomic",
            logit_transform=LogitTransform(scale=1.5, softcap=2.0)),
    }


def error_cases() -> dict[str, Callable[[], dict]]:
    """Bad inputs on 2 ranks (V = 67); test_vocab_parallel.py holds the error each must raise."""
    V = 67
    problem = make_problem(seed=9, V=V)
    B, T, H = problem.hidden.shape
    state: dict[str, Any] = {}

    def setup() -> dict[str, Any]:
        if not state:  # needs the process group: built on the first case, inside the spawned rank
            from torch.distributed.tensor import distribute_tensor, Shard

            mesh = cpu_mesh(dist.get_world_size())
            state.update(mesh=mesh, head=ShardedHead("group", problem.weight, problem.bias),
                         dt_weight=distribute_tensor(problem.weight, mesh, [Shard(0)]),
                         dt_bias=distribute_tensor(problem.bias, mesh, [Shard(0)]))
        return state

    def loss(hidden=None, weight=None, bias="head", ids=None, **kwargs):
        s = setup()
        kwargs.setdefault("process_group", dist.group.WORLD)
        return fused_linear_grpo_loss(problem.hidden if hidden is None else hidden,
                                      s["head"].weight if weight is None else weight,
                                      problem.completion_ids if ids is None else ids, problem.completion_mask,
                                      problem.advantages, bias=s["head"].bias if bias == "head" else bias, **kwargs)

    def weight_on_dim_1():
        from torch.distributed.tensor import distribute_tensor, Shard

        return loss(weight=distribute_tensor(problem.weight, setup()["mesh"], [Shard(1)]), bias=None,
                    process_group=None)

    def wrong_total():
        from torch.distributed.tensor import DTensor, Shard

        s = setup()
        weight = DTensor.from_local(s["dt_weight"].to_local(), s["mesh"], [Shard(0)], shape=(V + 5, H), stride=(H, 1))
        return loss(weight=weight, bias=None, process_group=None)

    def sharded_hidden():
        from torch.distributed.tensor import distribute_tensor, Shard

        return loss(hidden=distribute_tensor(problem.hidden, setup()["mesh"], [Shard(0)]))

    def hidden_sizes_differ():
        rank = dist.get_rank()
        return loss(hidden=torch.randn(B, T, H + rank), weight=torch.randn(setup()["head"].weight.shape[0], H + rank),
                    bias=None)

    def tokens_differ():
        rank = dist.get_rank()
        return loss(hidden=problem.hidden[: B - rank], ids=problem.completion_ids[: B - rank])

    cases = {
        "weight-sharded-on-dim-1": weight_on_dim_1,
        "dtensor-shards-sum-to-another-size": wrong_total,
        "process-group-with-dtensor": lambda: loss(weight=setup()["dt_weight"], bias=setup()["dt_bias"]),
        "plain-bias-with-dtensor-weight": lambda: loss(weight=setup()["dt_weight"], process_group=None),
        "dtensor-bias-with-plain-weight": lambda: loss(bias=setup()["dt_bias"]),
        "dtensor-hidden": sharded_hidden,
        "target-id-out-of-range": lambda: loss(ids=torch.full_like(problem.completion_ids, V)),
        "hidden-size-differs-between-ranks": hidden_sizes_differ,
        "tokens-differ-between-ranks": tokens_differ,
        "bias-shard-of-another-size": lambda: loss(
            bias=problem.bias[: setup()["head"].weight.shape[0] + dist.get_rank()]),
        "reference-backend": lambda: loss(backend="reference"),
        "a-rank-without-rows": lambda: linear_logprobs(problem.hidden, problem.weight[:dist.get_rank() * V],
                                                       problem.completion_ids % 1, process_group=dist.group.WORLD),
    }
    return {f"error-{name}": functools.partial(error_case, call) for name, call in cases.items()}


def suite_cases(suite: str) -> dict[str, Callable[[], dict]]:
    """The cases of a suite, by name; building them computes nothing (the test collects their names)."""
    if suite == "two_processes":
        return {**parity_cases(2, ("gemm", "torch")), **triton_cases(), **error_cases()}
    if suite == "three_processes":
        return parity_cases(3, ("gemm", "torch"))
    raise ValueError(f"unknown suite {suite!r}")


WORLD = {"two_processes": 2, "three_processes": 3}


def run(rank: int, world: int, init_file: str, suite: str, out_dir: str) -> None:
    """Every case of the suite on this rank; results (or the traceback of a case that raised) to
    out_dir/rank<rank>.pt."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results: dict[str, dict] = {}
    try:
        for name, case in suite_cases(suite).items():
            try:
                results[name] = case()
            except Exception:  # saved: the test reports it under the case's name
                results[name] = {"kind": "crashed", "traceback": traceback.format_exc()}
    finally:
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
        dist.destroy_process_group()
    leave_spawned_process()  # every result is on disk and the group is gone
