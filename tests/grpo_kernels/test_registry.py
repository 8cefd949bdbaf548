"""The backend registry is the one place a backend is named and its behaviour declared: no backend name is spelled
anywhere else in the package or the engine, and a backend registered with declared capabilities is honoured by the
API, routing, the custom ops and the vocabulary-parallel wrapper without any other edit."""

import ast
import dataclasses
import sys

import pytest
import torch
from grpo_testing import INTERPRETER, make_problem
from repo_paths import ROOT

from grpo_kernels import GRPOLossConfig, LogitTransform, fused_linear_grpo_loss, linear_logprobs, reference, routing
from grpo_kernels.backends import (BACKENDS, EPILOGUE, ONE_PASS, BackendSpec, auto_candidates, backend_names,
                                   get_backend, register_backend, token_level_route)
from grpo_kernels.backends import gemm as gemm_module
from grpo_kernels.backends import torch_streaming
from grpo_kernels.backends.protocol import EpilogueBackend, LogprobBackend, OnePassBackend, SequenceWavesBackend
from grpo_kernels.backends.vocab_parallel import VocabShard
from grpo_kernels.cost_model import library_paths

REGISTRY = "grpo_kernels/backends/__init__.py"
# String literals equal to a backend name that mean something else, with why.
NOT_BACKEND_NAMES = {
    ("grpo_kernels/__init__.py", "reference"): "the public submodule grpo_kernels.reference (lazy export table)",
    ("grpo_engine/state/checkpoint.py", "torch"): "the key of torch's RNG state in a checkpoint",
    ("grpo_engine/state/saved_state.py", "torch"): "the key of torch's RNG state, and the torch package among the "
                                                   "globals a checkpoint's files may name",
    ("grpo_engine/launch_agreement.py", "torch"): "the torch package, whose version every process compares",
    ("grpo_engine/launch_agreement.py", "triton"): "the triton package, whose version every process compares",
    ("grpo_engine/steps/reward_fence_process.py", "torch"): "the torch package, among the modules whose functions "
                                                             "the reward fence puts back",
    ("grpo_engine/config/plain_values.py", "torch"): "the torch package, whose scalars an override may hold",
}


def _is_module_lookup(parents: dict, node: ast.AST) -> bool:
    """`"name" in sys.modules`: a Python package's name, not a backend's."""
    parent = parents.get(node)
    return (isinstance(parent, ast.Compare) and parent.left is node
            and any(isinstance(c, ast.Attribute) and c.attr == "modules" and isinstance(c.value, ast.Name)
                    and c.value.id == "sys" for c in parent.comparators))


def _backend_name_literals() -> list[tuple[str, int, str]]:
    names = set(backend_names(with_auto=False))
    found = []
    for root in ("grpo_kernels", "grpo_engine"):
        for path in sorted((ROOT / root).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative == REGISTRY:
                continue
            tree = ast.parse(path.read_text(), filename=relative)
            parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
            for node in ast.walk(tree):
                if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
                        and not _is_module_lookup(parents, node)):
                    found.append((relative, node.lineno, node.value))
    return found


def test_no_backend_name_is_spelled_outside_the_registry():
    found = _backend_name_literals()
    spelled = [hit for hit in found if (hit[0], hit[2]) not in NOT_BACKEND_NAMES]
    assert not spelled, ("backend names spelled outside grpo_kernels/backends/__init__.py (read the registry entry "
                         f"instead: get_backend(name).<capability>, DEFAULT_BACKEND, ...): {spelled}")
    stale = set(NOT_BACKEND_NAMES) - {(path, literal) for path, _, literal in found}
    assert not stale, f"NOT_BACKEND_NAMES lists literals that are gone: {sorted(stale)}"


def test_the_scan_sees_a_spelled_name(tmp_path, monkeypatch):
    """The scan itself: a literal backend name in a comparison is found, a sys.modules lookup is not."""
    source = 'import sys\nuse = backend == "gemm"\nloaded = "triton" in sys.modules\n'
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    literals = [node for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    assert [(n.value, _is_module_lookup(parents, n)) for n in literals] == [("gemm", False), ("triton", True)]


def test_every_entry_implements_what_it_declares():
    for name, spec in BACKENDS.items():
        backend = spec.backend(1 << 20)
        assert isinstance(backend, LogprobBackend), name
        route_protocol = {ONE_PASS: OnePassBackend, EPILOGUE: EpilogueBackend, None: object}[spec.token_level_route]
        assert isinstance(backend, route_protocol), name
        assert not spec.sequence_waves or isinstance(backend, SequenceWavesBackend), name
        assert (name in library_paths()) == (spec.cost is not None), name
        assert not spec.auto or name in library_paths(), name
    assert [name for name, spec in BACKENDS.items() if spec.second_order] == \
        [name for name, spec in BACKENDS.items() if spec.materializes_logits]


@pytest.mark.parametrize("bad, message", [
    (dict(name="auto"), "other than 'auto'"),
    (dict(auto=True), "auto=True needs a cost model"),
    (dict(second_order=True), "second_order=True needs materializes_logits=True"),
    (dict(materializes_logits=True), "declare vocab_shards=False"),
    (dict(token_level_route="one_pass"), "token_level_route must be ONE_PASS, EPILOGUE or None"),
    (dict(auto=True, cost="grpo_kernels.cost_model.paths:triton", deterministic=False),
     "auto=True needs deterministic=True"),
])
def test_an_inconsistent_entry_is_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        BackendSpec(**{"name": "fake", "module": __name__, "summary": "a test backend", **bad})


def test_register_backend_refuses_duplicates_and_modules_without_a_backend():
    with pytest.raises(ValueError, match="'torch' is already registered"):
        register_backend(BackendSpec("torch", ".torch_streaming", "again"))
    with pytest.raises(ValueError, match="has no backend"):
        register_backend(BackendSpec("nothing", "grpo_kernels.head", "no backend() there"))
    with pytest.raises(TypeError, match="takes a BackendSpec"):
        register_backend("fake")
    assert "nothing" not in BACKENDS


# ---- a backend defined here, registered with declared capabilities --------------------------------------------

class RecordingBackend:
    """torch_streaming for the Protocol, the GEMM path for the one-pass route, recording what ran."""

    calls: list = []

    def __init__(self, workspace_bytes: int):
        self.workspace_bytes = workspace_bytes

    def linear_forward(self, hidden, head, targets):
        self.calls.append("forward")
        return torch_streaming.linear_forward(hidden, head, targets)

    def linear_backward(self, *args, **kwargs):
        self.calls.append("backward")
        return torch_streaming.linear_backward(*args, **kwargs)

    def linear_forward_with_grads(self, *args, **kwargs):
        self.calls.append("one_pass")
        return gemm_module.backend(self.workspace_bytes).linear_forward_with_grads(*args, **kwargs)


def backend(workspace_bytes: int) -> RecordingBackend:
    return RecordingBackend(workspace_bytes)


@pytest.fixture()
def register():
    """Registers a spec of this module's backend for one test."""
    RecordingBackend.calls = []

    def add(**declared) -> BackendSpec:
        return register_backend(BackendSpec("recording", __name__, "records its calls", **declared))

    yield add
    BACKENDS.pop("recording", None)
    routing._cached_route.cache_clear()


def _loss(p, backend, config=GRPOLossConfig(beta=0.04), **kwargs):
    hidden = p.hidden.clone().requires_grad_()
    out = fused_linear_grpo_loss(hidden, p.weight, p.completion_ids, p.completion_mask, p.advantages,
                                 ref_logps=p.ref_logps, config=config, backend=backend, **kwargs)
    out.loss.backward()
    return out, hidden.grad


def _reference(p, config=GRPOLossConfig(beta=0.04), **kwargs):
    h64 = p.hidden.double().requires_grad_()
    out = reference.fused_linear_grpo_loss(h64, p.weight.double(), p.completion_ids, p.completion_mask,
                                           p.advantages, ref_logps=p.ref_logps, config=config, **kwargs)
    out.loss.backward()
    return out, h64.grad


def test_a_registered_backend_is_listed_everywhere_the_names_are_read(register):
    register()
    import grpo_kernels.api as api

    assert "recording" in backend_names() and get_backend("recording").summary == "records its calls"
    from grpo_engine.config import RunConfig

    # the engine's choices are the registry's names, read when the config is checked
    assert RunConfig(loss_backend="recording").loss_backend == "recording"
    assert api.resolve_backend("recording", torch.device("cpu")) == "recording"


def test_a_declared_one_pass_route_runs_the_backends_own_pass(register):
    """A new backend declaring the one-pass route runs its own linear_forward_with_grads (not the GEMM path's),
    and its name reaches the backward's second-order refusal."""
    register(token_level_route=ONE_PASS)
    p = make_problem(seed=21, B=2, T=5, H=12, V=30)
    out, grad = _loss(p, "recording")
    assert RecordingBackend.calls == ["one_pass"]
    expected, expected_grad = _reference(p)
    torch.testing.assert_close(out.loss.double(), expected.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-4, atol=1e-6)
    hidden = p.hidden.clone().requires_grad_()
    loss = fused_linear_grpo_loss(hidden, p.weight, p.completion_ids, p.completion_mask, p.advantages,
                                  backend="recording").loss
    with pytest.raises(RuntimeError, match="second-order gradient .* backend='recording'"):
        torch.autograd.grad(loss, hidden, create_graph=True)


def test_without_a_route_the_same_loss_takes_the_two_step_route(register):
    register()
    p = make_problem(seed=22, B=2, T=5, H=12, V=30)
    out, grad = _loss(p, "recording")
    assert RecordingBackend.calls == ["forward", "backward"]
    expected, expected_grad = _reference(p)
    torch.testing.assert_close(out.loss.double(), expected.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("declared, call, message", [
    (dict(kept_token_sets=False), "kept", r"backend='recording' does not support kept-token sets \(kept_token_ids\) "
                                          r"\(kept_token_sets=False in its registry entry\); use one of \['auto'"),
    (dict(logit_transforms=False), "transform", r"backend='recording' does not support a logit_transform other "
                                                r"than the identity"),
])
def test_an_undeclared_feature_is_refused_naming_the_backend_before_any_work(register, declared, call, message):
    register(**declared)
    p = make_problem(seed=23, B=2, T=5, H=12, V=30)
    kwargs = (dict(kept_token_ids=torch.stack([p.completion_ids, (p.completion_ids + 1) % 30], dim=-1))
              if call == "kept" else dict(logit_transform=LogitTransform(softcap=5.0)))
    for run in (lambda: _loss(p, "recording", **kwargs),
                lambda: linear_logprobs(p.hidden, p.weight, p.completion_ids, backend="recording", **kwargs)):
        with pytest.raises(ValueError, match=message):
            run()
    assert RecordingBackend.calls == []
    # the identity transform is no transform: accepted
    if call == "transform":
        linear_logprobs(p.hidden, p.weight, p.completion_ids, backend="recording", logit_transform=LogitTransform())
        assert RecordingBackend.calls == ["forward"]


@pytest.fixture()
def deterministic_algorithms():
    """torch.use_deterministic_algorithms(True) for one test, then the setting as it was."""
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(was, warn_only=warn_only)


def test_a_non_deterministic_backend_is_refused_under_deterministic_algorithms(register, deterministic_algorithms):
    """A caller who asked torch for bitwise repeatable results gets one line naming the backend before any work,
    and `auto` never picks a non-deterministic backend at all (an entry declaring both is refused)."""
    register(deterministic=False)
    p = make_problem(seed=26, B=2, T=5, H=12, V=30)
    message = (r"backend='recording' does not support torch.use_deterministic_algorithms\(True\) \(bitwise "
               r"repeatable results\) \(deterministic=False in its registry entry\); use one of \['auto'")
    for run in (lambda: _loss(p, "recording"),
                lambda: linear_logprobs(p.hidden, p.weight, p.completion_ids, backend="recording")):
        with pytest.raises(ValueError, match=message):
            run()
    assert RecordingBackend.calls == []
    assert "recording" not in auto_candidates()
    assert all(BACKENDS[name].deterministic for name in auto_candidates())
    torch.use_deterministic_algorithms(False)
    _loss(p, "recording")
    assert RecordingBackend.calls == ["forward", "backward"]


def test_the_opt_in_atomic_backward_is_declared_and_refused_where_repeatability_is_asked(deterministic_algorithms):
    spec = get_backend("triton_atomic")
    assert not spec.deterministic and not spec.auto and spec.triton_kernels
    p = make_problem(seed=27, B=2, T=5, H=12, V=30)
    with pytest.raises(ValueError, match=r"backend='triton_atomic' does not support torch.use_deterministic"):
        _loss(p, "triton_atomic")
    assert "triton" in [name for name, spec in BACKENDS.items() if spec.deterministic]


def test_a_backend_without_vocabulary_shards_is_refused_for_a_sharded_head(register):
    """Refused in sharded_head as soon as the head is known to be sharded: before the group is looked at and before
    its all-gather of the shard layout (so no group is needed to see it)."""
    register(vocab_shards=False)
    p = make_problem(seed=24, B=2, T=5, H=12, V=30)
    with pytest.raises(ValueError, match=r"backend='recording' does not support a vocabulary-sharded head"):
        linear_logprobs(p.hidden, p.weight, p.completion_ids, backend="recording", process_group=object())
    assert RecordingBackend.calls == []


def test_a_backend_not_declaring_compile_is_refused_inside_a_compiled_graph(register, monkeypatch):
    register(torch_compile=False)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    p = make_problem(seed=25, B=2, T=5, H=12, V=30)
    with pytest.raises(ValueError, match=r"backend='recording' does not support running inside a torch.compile"):
        linear_logprobs(p.hidden, p.weight, p.completion_ids, backend="recording")


def test_the_vocabulary_parallel_one_pass_runs_the_declared_backend(register, monkeypatch):
    """On a shard, the one-pass route is the registered backend's, with the shard's per-wave combine."""
    from grpo_kernels.backends import vocab_parallel
    from grpo_kernels.head import LMHead
    from grpo_kernels.objective import token_inputs

    register(token_level_route=ONE_PASS)
    p = make_problem(seed=26, B=1, T=6, H=8, V=20)
    shard = VocabShard(group=None, sizes=(20,), rank=0)
    monkeypatch.setattr(VocabShard, "combine_stats", lambda self, lse, ent, z: (lse, ent, z))
    monkeypatch.setattr(VocabShard, "all_reduce_sum_", lambda self, x: x)
    config = GRPOLossConfig()
    rows = token_inputs(torch.ones(1, 6), p.advantages, config, None, None, None, None)
    flat = dataclasses.replace(rows, **{k: None if v is None else v.reshape(-1) for k, v in vars(rows).items()})
    head = LMHead(p.weight, None, 1.0, None, shard)
    outputs = vocab_parallel.one_pass_token_level("recording", p.hidden[0], head, p.completion_ids[0], flat, config,
                                                  1 << 20, True, True)
    assert RecordingBackend.calls == ["one_pass"]
    expected = fused_linear_grpo_loss(p.hidden, p.weight, p.completion_ids, torch.ones(1, 6), p.advantages,
                                      config=config, backend="torch")
    torch.testing.assert_close(outputs[2].sum(), expected.loss, rtol=1e-5, atol=1e-6)


def test_auto_routes_to_a_registered_backend_where_its_model_says_it_is_fastest(register, monkeypatch):
    register(cost=f"{__name__}:instant", auto=True)
    h100 = routing.DeviceSpec("cuda", "NVIDIA H100 80GB HBM3")
    routing._cached_route.cache_clear()
    try:
        assert routing.route("token", 8192, 4096, 151936, "bfloat16", h100).backend == "recording"
        monkeypatch.setattr(routing, "device_spec", lambda device: h100)
        p = make_problem(seed=27, B=2, T=5, H=12, V=30, dtype=torch.bfloat16)
        linear_logprobs(p.hidden, p.weight, p.completion_ids)  # auto
        assert RecordingBackend.calls == ["forward"]
        # a call needing what it does not declare: auto leaves it out
        monkeypatch.setitem(BACKENDS, "recording", dataclasses.replace(BACKENDS["recording"], kept_token_sets=False))
        monkeypatch.setitem(BACKENDS, "triton", dataclasses.replace(BACKENDS["triton"], auto=False))  # CPU tensors
        RecordingBackend.calls = []
        linear_logprobs(p.hidden, p.weight, p.completion_ids, kept_token_ids=p.completion_ids[..., None])
        assert RecordingBackend.calls == []
    finally:
        routing._cached_route.cache_clear()


def instant(p):
    """A cost model that says this backend takes no time and no memory."""
    from grpo_kernels.cost_model import Estimate

    return Estimate("instant", p, [], gemms=1, peak_extra_bytes=0, fp32_weight_grad_bytes=0)


def test_the_token_level_decision_is_one_function_of_the_entry_and_the_call():
    dapo, gspo = GRPOLossConfig(), GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence")
    cases = {
        ("gemm", dapo, False, False, False): ONE_PASS,
        ("gemm", dapo, False, False, True): None,  # a compiled graph cannot run the one-pass op
        ("gemm", dapo, False, True, False): ONE_PASS,  # combined per wave on a shard
        ("gemm", dapo, True, False, False): None,  # kept sets: no logits pass to fuse into
        ("gemm", gspo, False, False, False): None,  # sequence-level
        ("triton", dapo, False, False, False): EPILOGUE,
        ("triton", dapo, False, False, True): None,  # torch 2.11 cannot trace the epilogue's per-token inputs
        ("triton", dapo, False, True, False): None,  # the epilogue does not combine shards
        ("torch", dapo, False, False, False): None,
        ("gemm", None, False, False, False): None,  # log-probs: no objective
    }
    for (name, config, kept, sharded, compiling), route in cases.items():
        assert token_level_route(name, config, kept_sets=kept, sharded=sharded, compiling=compiling) is route, \
            (name, config, kept, sharded, compiling)
    assert sys.modules[__name__].backend is backend


def _declaring_batch_invariance() -> list:
    declared = [pytest.param(name, marks=[INTERPRETER] if spec.triton_kernels else [])
                for name, spec in BACKENDS.items() if spec.batch_invariant]
    return declared or [pytest.param(None, marks=pytest.mark.skip(reason="no backend declares batch invariance"))]


@pytest.mark.parametrize("name", _declaring_batch_invariance())
def test_a_backend_declaring_batch_invariance_gives_a_row_the_same_bits_in_any_batch(name):
    """A row's log-prob and entropy alone, and at several positions of batches of several sizes: bitwise equal."""
    gen = torch.Generator().manual_seed(28)
    H, V = 16, 300
    weight = torch.randn(V, H, generator=gen).bfloat16()
    row, target = torch.randn(1, H, generator=gen).bfloat16(), torch.randint(0, V, (1,), generator=gen)
    alone = linear_logprobs(row, weight, target, backend=name, return_entropy=True)
    for size, position in ((2, 1), (7, 0), (7, 6), (37, 20)):
        hidden = torch.randn(size, H, generator=gen).bfloat16()
        targets = torch.randint(0, V, (size,), generator=gen)
        hidden[position], targets[position] = row[0], target[0]
        batch = linear_logprobs(hidden, weight, targets, backend=name, return_entropy=True)
        for got, want in zip(batch, alone):
            assert torch.equal(got[position:position + 1], want), (name, size, position)
