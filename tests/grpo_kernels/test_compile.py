"""The fused loss inside a torch.compile'd training step: one graph, no breaks (fullgraph=True)."""

import pytest
import torch

from grpo_kernels import GRPOLossConfig, LogitTransform, fused_linear_grpo_loss, linear_logprobs

# a plain head, and a Gemma-style one (scaled, soft-capped): the transform's scalars cross the custom ops
HEADS = pytest.mark.parametrize("transform", [None, LogitTransform(scale=1.5, softcap=2.0)],
                                ids=["plain", "softcapped"])


class TinyPolicy(torch.nn.Module):
    def __init__(self, vocab: int = 40, hidden: int = 16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.body = torch.nn.Linear(hidden, hidden)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)


@HEADS
@pytest.mark.parametrize("backend", ["gemm", "torch"])
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
@pytest.mark.parametrize("backend", ["gemm", "torch"])
def test_compiled_logprobs_under_no_grad(backend, transform):
    hidden, weight = torch.randn(2, 5, 8), torch.randn(30, 8)
    targets = torch.randint(0, 30, (2, 5))
    fn = torch.compile(lambda h: linear_logprobs(h, weight, targets, backend=backend, logit_transform=transform),
                       backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(fn(hidden), linear_logprobs(hidden, weight, targets, backend="reference",
                                                               logit_transform=transform))
