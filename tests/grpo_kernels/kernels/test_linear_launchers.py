"""The Triton linear launchers against a float64 reference computed here from the logits: the
split-vocabulary forward, the transposed-tile backward, gradients that are not needed, and targets that
lie outside the weight's vocabulary (a vocabulary shard: -1 means "not in this shard"), for plain heads and heads
whose logits are soft-capped and scaled."""

import pytest
import torch
from grpo_testing import GRAD_ATOL, GRAD_TOL, LOSS_TOL, triton_device

from grpo_kernels import LMHead, LogitTransform
from grpo_kernels.head import IDENTITY
from grpo_kernels.kernels import launch

TEMPERATURE = 0.7
# A soft-cap the raw logits (std ~3) saturate, after a scale: the transformed kernels' chain rule
SOFTCAPPED = LogitTransform(scale=1.4, softcap=3.0)
TRANSFORMS = pytest.mark.parametrize("transform", [IDENTITY, SOFTCAPPED], ids=["plain", "softcapped"])


def _inputs(seed: int, N: int = 45, H: int = 40, V: int = 300, dtype=torch.float32, with_bias: bool = True,
            out_of_shard: int = 0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=gen, dtype=torch.float64)
    weight = torch.randn(V, H, generator=gen, dtype=torch.float64) * (3.0 / H ** 0.5)
    bias = torch.randn(V, generator=gen, dtype=torch.float64) * 0.5 if with_bias else None
    targets = torch.randint(0, V, (N,), generator=gen)
    targets[:out_of_shard] = -1
    g = torch.randn(N, generator=gen, dtype=torch.float64)
    e = torch.randn(N, generator=gen, dtype=torch.float64) * 0.1
    cast = [x if x is None else x.to(dtype) for x in (hidden, weight, bias)]
    return cast, targets, g, e


def _float64_stats(hidden, weight, bias, targets, transform=IDENTITY):
    """(logps, entropy, lse, log_p) in float64 from the inputs as rounded to their dtype."""
    z = transform.apply(hidden.double() @ weight.double().T + (0.0 if bias is None else bias.double())) / TEMPERATURE
    log_p = torch.log_softmax(z, -1)
    lse = torch.logsumexp(z, -1)
    in_shard = (targets >= 0) & (targets < weight.shape[0])
    target_z = torch.where(in_shard, z.gather(1, targets.clamp(0, weight.shape[0] - 1)[:, None])[:, 0], 0.0)
    entropy = -(log_p.exp() * log_p).sum(-1)
    return target_z - lse, entropy, lse, log_p


def _float64_grads(hidden, weight, bias, targets, g, e, transform=IDENTITY):
    """(dhidden, dweight, dbias) of sum(g lp + e entropy), by float64 autograd through the transform."""
    leaves = [x.detach().double().requires_grad_() for x in (hidden, weight, bias if bias is not None else
                                                               torch.zeros(weight.shape[0]))]
    logps, entropy, _, _ = _float64_stats(*leaves, targets, transform)
    (g * logps + e * entropy).sum().backward()
    return tuple(leaf.grad for leaf in leaves)


def _float64_dz(hidden, weight, bias, targets, g, e):
    """dLoss/dlogits: g (onehot - p) - e p (log p + entropy), over tau; no one-hot for a target off the shard."""
    _, entropy, _, log_p = _float64_stats(hidden, weight, bias, targets)
    p = log_p.exp()
    onehot = torch.zeros_like(p)
    in_shard = targets >= 0
    onehot[in_shard.nonzero()[:, 0], targets[in_shard]] = 1.0
    return (g[:, None] * (onehot - p) - e[:, None] * p * (log_p + entropy[:, None])) / TEMPERATURE


def _on_device(*tensors):
    device = triton_device()
    return [None if t is None else t.to(device) for t in tensors]


def _head(weight, bias, transform=IDENTITY) -> LMHead:
    weight, bias = _on_device(weight, bias)
    return LMHead(weight, bias, TEMPERATURE, transform)


def _forward_args(hidden, weight, bias, targets, transform=IDENTITY):
    """(hidden, head, targets) of launch.linear_forward, on the Triton device."""
    return _on_device(hidden)[0], _head(weight, bias, transform), _on_device(targets)[0]


def _backward_args(g, e, hidden, weight, bias, targets, lse, entropy, transform=IDENTITY):
    """The positional arguments of launch.linear_backward, on the Triton device."""
    g, e, hidden, targets, lse, entropy = _on_device(g.float(), e.float(), hidden, targets, lse.float(),
                                                     entropy.float())
    return g, e, hidden, _head(weight, bias, transform), targets, lse, entropy


def _assert_grad(actual, expected, dtype, what):
    err = float((actual.cpu().double() - expected).abs().max())
    assert err <= GRAD_TOL[dtype] * float(expected.abs().max()) + GRAD_ATOL[dtype], f"{what}: max error {err:.3g}"


@TRANSFORMS
@pytest.mark.parametrize("vocab_major", [True, False], ids=["vocab_major", "token_major"])
@pytest.mark.parametrize("splits", [1, 3, 64])
def test_forward_matches_float64(monkeypatch, splits, vocab_major, transform):
    from grpo_kernels.kernels.configs import INTERPRETER_CONFIGS, KernelConfig

    # both tile layouts of the GPU tables (16-bit inputs: vocabulary-major; float32: token-major)
    monkeypatch.setitem(INTERPRETER_CONFIGS, "forward", KernelConfig(32, 64, 32, vocab_major=vocab_major))
    (hidden, weight, bias), targets, _, _ = _inputs(seed=splits)
    logps, entropy, lse = launch.linear_forward(*_forward_args(hidden, weight, bias, targets, transform),
                                                vocab_splits=splits)
    expected = _float64_stats(hidden, weight, bias, targets, transform)
    tol = LOSS_TOL[torch.float32] * 10
    for name, actual, ref in zip(("logps", "entropy", "lse"), (logps, entropy, lse), expected):
        torch.testing.assert_close(actual.cpu().double(), ref, atol=tol, rtol=tol, msg=name)


def test_split_forward_is_bitwise_reproducible():
    (hidden, weight, bias), targets, _, _ = _inputs(seed=5)
    args = _forward_args(hidden, weight, bias, targets, SOFTCAPPED)
    runs = [launch.linear_forward(*args, vocab_splits=4) for _ in range(2)]
    for first, second in zip(*runs):
        assert torch.equal(first, second)


def _grpo_forward(hidden, weight, bias, targets, splits, transform=IDENTITY):
    N = hidden.shape[0]
    gen = torch.Generator().manual_seed(11)
    advantages = torch.randn(N, generator=gen)
    old = torch.randn(N, generator=gen) * 0.1 - 5.0
    ref = torch.randn(N, generator=gen) * 0.1 - 5.0
    mask = (torch.rand(N, generator=gen) > 0.2).float()
    weights = mask / mask.sum()
    objective = dict(eps_low=0.2, eps_high=0.28, delta=None, beta=0.04, sapo_pos=1.0, sapo_neg=1.05, loss_kind=0,
                     bias_correction=False)
    per_token = _on_device(advantages, weights, weights * 0.01, old, ref, None, mask)
    return launch.linear_grpo_forward(*_forward_args(hidden, weight, bias, targets, transform), *per_token, objective,
                                      vocab_splits=splits)


@TRANSFORMS
def test_split_grpo_forward_matches_unsplit(transform):
    (hidden, weight, bias), targets, _, _ = _inputs(seed=2)
    whole = _grpo_forward(hidden, weight, bias, targets, splits=1, transform=transform)
    split = _grpo_forward(hidden, weight, bias, targets, splits=5, transform=transform)
    again = _grpo_forward(hidden, weight, bias, targets, splits=5, transform=transform)
    names = ("terms", "logps", "entropy", "lse", "grad", "kl", "clip")
    for name, a, b, c in zip(names, whole, split, again):
        assert torch.equal(b, c), f"{name} differs between two split runs"
        if name == "clip":
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5, msg=name)
    expected_logps = _float64_stats(hidden, weight, bias, targets, transform)[0]
    torch.testing.assert_close(split[1].cpu().double(), expected_logps, atol=1e-4, rtol=1e-4)


def test_auto_vocab_splits_fill_the_gpu_only_when_tokens_cannot():
    from grpo_kernels.kernels.configs import KernelConfig
    from grpo_kernels.kernels.linear_forward import _split_width, auto_vocab_splits

    config = KernelConfig(64, 128, 64)
    assert auto_vocab_splits(8192 * 4, 151936, config, sm_count=132) == 1
    assert auto_vocab_splits(512, 151936, config, sm_count=132) == 17  # 8 token blocks x 17 splits >= 132
    assert auto_vocab_splits(64, 1000, config, sm_count=132) == 1  # 8 vocabulary tiles: too few to split
    for V in range(1, 2000, 37):
        for splits in (1, 2, 3, 7, 50):
            width, used = _split_width(V, splits, 128)
            assert width % 128 == 0 and used <= splits and (used - 1) * width < V <= used * width, (V, splits)


@TRANSFORMS
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [True, False])
def test_backward_matches_float64(dtype, with_bias, transform):
    (hidden, weight, bias), targets, g, e = _inputs(seed=3, dtype=dtype, with_bias=with_bias)
    _, entropy, lse, _ = _float64_stats(hidden, weight, bias, targets, transform)
    args = _backward_args(g, e, hidden, weight, bias, targets, lse, entropy, transform)
    grads = launch.linear_backward(*args)
    expected = _float64_grads(hidden, weight, bias, targets, g, e, transform)
    for name, actual, ref in zip(("hidden", "weight", "bias"), grads, expected):
        if name == "bias" and not with_bias:
            assert actual is None
            continue
        _assert_grad(actual, ref, dtype, f"d{name}")
    again = launch.linear_backward(*args)
    for first, second in zip(grads, again):
        assert first is None or torch.equal(first, second)


@pytest.mark.parametrize("needs", [(True, False), (False, True), (False, False)], ids=["frozen_head", "frozen_hidden",
                                                                                         "neither"])
def test_backward_skips_gradients_not_needed(monkeypatch, needs):
    from grpo_kernels.kernels import linear_backward as module

    sizes = []

    class RecordingTorch:
        """The launcher module's `torch`, recording the shape of every zeros() buffer."""

        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def zeros(*shape, **kwargs):
            out = torch.zeros(*shape, **kwargs)
            sizes.append(tuple(out.shape))
            return out

    monkeypatch.setattr(module, "torch", RecordingTorch())
    (hidden, weight, bias), targets, g, e = _inputs(seed=4, N=20, V=130)
    _, entropy, lse, _ = _float64_stats(hidden, weight, bias, targets)
    args = _backward_args(g, e, hidden, weight, bias, targets, lse, entropy)
    needs_hidden, needs_weight = needs
    grad_hidden, grad_weight, grad_bias = launch.linear_backward(
        *args, needs_hidden_grad=needs_hidden, needs_weight_grad=needs_weight)
    expected = _float64_grads(hidden, weight, bias, targets, g, e)
    assert (grad_hidden is not None) == needs_hidden
    assert (grad_weight is not None) == needs_weight and (grad_bias is not None) == needs_weight
    assert (tuple(weight.shape) in sizes) == needs_weight, f"buffers allocated: {sizes}"
    assert (tuple(hidden.shape) in sizes) == needs_hidden, f"buffers allocated: {sizes}"
    if needs_hidden:
        _assert_grad(grad_hidden, expected[0], torch.float32, "dhidden")
    if needs_weight:
        _assert_grad(grad_weight, expected[1], torch.float32, "dweight")


def test_out_of_shard_targets_linear():
    """Targets -1: log-prob -lse (no target logit), and no one-hot term in any gradient."""
    (hidden, weight, bias), targets, g, e = _inputs(seed=6, out_of_shard=10)
    expected_logps, expected_entropy, expected_lse, _ = _float64_stats(hidden, weight, bias, targets)
    torch.testing.assert_close(expected_logps[:10], -expected_lse[:10])
    for splits in (1, 3):
        logps, entropy, lse = launch.linear_forward(*_forward_args(hidden, weight, bias, targets),
                                                    vocab_splits=splits)
        torch.testing.assert_close(logps.cpu().double(), expected_logps, atol=1e-4, rtol=1e-4)
    args = _backward_args(g, e, hidden, weight, bias, targets, expected_lse, expected_entropy)
    grads = launch.linear_backward(*args)
    for name, actual, ref in zip(("hidden", "weight", "bias"), grads, _float64_grads(hidden, weight, bias, targets,
                                                                                      g, e)):
        _assert_grad(actual, ref, torch.float32, f"d{name}")


def test_out_of_shard_targets_logits():
    (hidden, weight, bias), targets, g, e = _inputs(seed=7, N=24, out_of_shard=6)
    z = hidden.double() @ weight.double().T + bias.double()
    expected_logps, expected_entropy, expected_lse, _ = _float64_stats(hidden, weight, bias, targets)
    logits, flat_targets = _on_device(z.float().view(2, 12, -1), targets.view(2, 12))
    logps, entropy, lse = launch.logits_forward(logits, flat_targets, TEMPERATURE)
    torch.testing.assert_close(logps.cpu().double().flatten(), expected_logps, atol=1e-4, rtol=1e-4)
    grad_logits = launch.logits_backward(*_on_device(g.float().view(2, 12), e.float().view(2, 12)), logits,
                                         flat_targets, lse, entropy, TEMPERATURE)
    expected = _float64_dz(hidden, weight, bias, targets, g, e)
    _assert_grad(grad_logits.reshape(24, -1), expected, torch.float32, "dlogits")



@pytest.mark.parametrize("bad", [0, -2, 1.5])
def test_vocab_splits_must_be_a_positive_int(bad):
    (hidden, weight, bias), targets, _, _ = _inputs(seed=8, N=4, V=20)
    with pytest.raises(ValueError, match="vocab_splits must be a positive int"):
        launch.linear_forward(*_forward_args(hidden, weight, bias, targets), vocab_splits=bad)
