"""The fused loss inside a torch.compile'd training step: one graph, no breaks (fullgraph=True)."""

import pytest
import torch

from grpo_testing import registered_backends, with_triton_interpreted

from grpo_kernels import GRPOLossConfig, LogitTransform, fused_linear_grpo_loss, linear_logprobs

# every streaming backend that declares it runs in a compiled graph (the baseline's graph is plain autograd); those
# running Triton under the interpreter take ~10 s a case on CPU: the slow tier (the conformance tests compile
# them in the fast one)
COMPILED_BACKENDS = [pytest.param(backend.values[0], marks=[*backend.marks, pytest.mark.slow])
                     if isinstance(backend, type(pytest.param(None))) else backend
                     for backend in with_triton_interpreted(registered_backends(torch_compile=True,
                                                                                materializes_logits=False))]
# a plain head, and a Gemma-style one (scaled, soft-capped): the transform's scalars cross the custom ops
HEADS = pytest.mark.parametrize("transform", [None, LogitTransform(scale=1.5, softcap=2.0)],
                                ids=["plain", "softcapped"])


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each case compiles afresh: the cases share code objects, and their count (one per registered backend) would
    otherwise pass dynamo's recompile limit."""
    torch._dynamo.reset()


class TinyPolicy(torch.nn.Module):
    def __init__(self, vocab: int = 40, hidden: int = 16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.body = torch.nn.Linear(hidden, hidden)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)


@HEADS
@pytest.mark.parametrize("backend", COMPILED_BACKENDS)
@pytest.mark.parametrize("config", [GRPOLossConfig(beta=0.04, entropy_coef=0.01),
                                    GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence",
                                                   top_entropy_quantile=0.5)], ids=["dapo_kl", "gspo_entropy_mask"])
def test_compiled_step_matches_eager(config, backend, transform):
    torch.manual_seed(0)
    model = TinyPolicy()
    ids = torch.randint(0, 40, (3, 7))
    mask = torch.ones(3, 6)
    advantages = torch.randn(3)
    ref_logps = torch.randn(3, 6) - 3

    def step(input_ids):
        hidden = torch.tanh(model.body(model.embed(input_ids[:, :-1])))
        out = fused_linear_grpo_loss(hidden, model.lm_head.weight, input_ids[:, 1:], mask, advantages,
                                     ref_logps=ref_logps, config=config, backend=backend, logit_transform=transform)
        return out.loss

    eager = step(ids)
    eager.backward()
    eager_grad = model.lm_head.weight.grad.clone()
    model.zero_grad()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    loss = compiled(ids)
    loss.backward()
    torch.testing.assert_close(loss, eager)
    torch.testing.assert_close(model.lm_head.weight.grad, eager_grad)


@HEADS
@pytest.mark.parametrize("backend", COMPILED_BACKENDS)
def test_compiled_logprobs_under_no_grad(backend, transform):
    hidden, weight = torch.randn(2, 5, 8), torch.randn(30, 8)
    targets = torch.randint(0, 30, (2, 5))
    fn = torch.compile(lambda h: linear_logprobs(h, weight, targets, backend=backend, logit_transform=transform),
                       backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(fn(hidden), linear_logprobs(hidden, weight, targets, backend="reference",
                                                               logit_transform=transform))


def _compiled_loss(fullgraph: bool):
    weight, mask = torch.randn(30, 8), torch.ones(2, 5)

    def loss(hidden, completion_ids, advantages):
        return fused_linear_grpo_loss(hidden, weight, completion_ids, mask, advantages, backend="torch").loss

    return loss, torch.compile(loss, backend="aot_eager", fullgraph=fullgraph)


@pytest.mark.parametrize("bad, message", [
    (dict(completion_ids=torch.randint(0, 30, (2, 4))), r"completion_ids must have shape \[2, 5\], got \[2, 4\]"),
    (dict(completion_ids=torch.zeros(2, 5)), r"completion_ids must be an integer tensor"),
    (dict(advantages=torch.randn(3)), r"advantages must have shape \[B\]=\[2\], \[B, 1\]=\[2, 1\] or \[B, T\]"),
    (dict(advantages=torch.ones(2, dtype=torch.bool)), r"advantages must be a floating tensor"),
])
def test_shape_and_dtype_checks_run_under_compile(bad, message):
    """Metadata checks hold inside a compiled graph: the same message as in eager (fullgraph=True surfaces it
    through Dynamo's error, which quotes it)."""
    inputs = dict(hidden=torch.randn(2, 5, 8), completion_ids=torch.randint(0, 30, (2, 5)), advantages=torch.randn(2))
    inputs.update(bad)
    eager, compiled = _compiled_loss(fullgraph=False)
    for fn in (eager, compiled):
        with pytest.raises(ValueError if "shape" in message else TypeError, match=message):
            fn(**inputs)
    _, whole_graph = _compiled_loss(fullgraph=True)
    with pytest.raises(Exception, match=message):
        whole_graph(**inputs)


def test_value_checks_run_in_eager_only():
    """NaN advantages and out-of-range ids are refused in eager; a compiled graph does not synchronise to look
    (the NaN propagates, as in any compiled model)."""
    hidden, ids, advantages = torch.randn(2, 5, 8), torch.randint(0, 30, (2, 5)), torch.randn(2)
    advantages[0] = float("nan")
    eager, compiled = _compiled_loss(fullgraph=True)
    with pytest.raises(ValueError, match="advantages contains NaN or Inf values"):
        eager(hidden, ids, advantages)
    assert torch.isnan(compiled(hidden, ids, advantages))
    with pytest.raises(ValueError, match=r"completion_ids must hold token ids in \[0, 30\)"):
        eager(hidden, ids + 30, torch.randn(2))
