"""AdamW over float32 copies of 16-bit weights (grpo_engine/model/master_weights.py): its copies take exactly the
steps torch's AdamW takes on float32 weights, the model's weights are those copies rounded, steps far below a
bfloat16 weight's spacing add up until they move it (torch's AdamW on the same weights leaves them as they were), and
a saved state restores its copies and moments in float32, so a resumed run continues as if never stopped."""

from __future__ import annotations

import logging

import pytest
import torch
from accelerate import Accelerator
from hypothesis import given, settings, strategies as st

from grpo_engine.model.master_weights import MASTER, MasterWeightAdamW, needs_master_weights, trained_weights_adamw
from grpo_engine.state.checkpoint_error import CheckpointError
from grpo_engine.state.saved_state import check_optimizer_state
from grpo_engine.model.update_precision import check_update_precision

HALF = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _weights(seed: int, dtype: torch.dtype, scale: float = 0.02) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter((torch.randn(*shape, generator=generator) * scale).to(dtype))
            for shape in ((16, 8), (8,), (3, 5, 2))]


def _gradients(seed: int, weights: list[torch.Tensor], steps: int) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed + 1)
    return [[torch.randn(w.shape, generator=generator).to(w.dtype) for w in weights] for _ in range(steps)]


def _settings(lr: float, decay: float) -> dict:
    return dict(lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=decay)


@settings(max_examples=20, deadline=None)
@given(dtype=st.sampled_from(sorted(HALF)), seed=st.integers(0, 2**16), lr_exponent=st.floats(-7, -2),
       decay=st.sampled_from([0.0, 0.01, 0.1]), steps=st.integers(1, 6))
def test_the_copies_take_torchs_float32_adamw_steps_and_the_weights_are_them_rounded(dtype, seed, lr_exponent,
                                                                                    decay, steps):
    lr = 10.0 ** lr_exponent
    weights = _weights(seed, HALF[dtype])
    reference = [torch.nn.Parameter(w.detach().float()) for w in weights]
    ours = MasterWeightAdamW(weights, **_settings(lr, decay))
    theirs = torch.optim.AdamW(reference, foreach=False, **_settings(lr, decay))
    for grads in _gradients(seed, weights, steps):
        for w, r, g in zip(weights, reference, grads):
            w.grad, r.grad = g, g.float()
        ours.step()
        theirs.step()
    for w, r in zip(weights, reference):
        master = ours.state[w][MASTER]
        assert master.dtype == torch.float32 and torch.equal(master, r.detach())  # bitwise: the same arithmetic
        assert torch.equal(w.detach(), r.detach().to(w.dtype))
        for key in ("exp_avg", "exp_avg_sq"):
            assert ours.state[w][key].dtype == torch.float32 and torch.equal(ours.state[w][key], theirs.state[r][key])


def test_steps_below_a_bfloat16_weights_spacing_add_up_until_they_move_it():
    """At the engine's default learning rate 1e-6, bfloat16 weights near 0.02 (spaced 1.2e-4) never move under
    torch's AdamW; through float32 copies they move once the steps add up to half their spacing."""
    plain, copied = _weights(0, torch.bfloat16), _weights(0, torch.bfloat16)
    start = [w.detach().clone() for w in plain]
    optimizers = [torch.optim.AdamW(plain, **_settings(1e-6, 0.0)),
                  MasterWeightAdamW(copied, **_settings(1e-6, 0.0))]
    for _ in range(200):  # every gradient 1: each step moves a float32 weight by 1e-6
        for w in (*plain, *copied):
            w.grad = torch.ones_like(w)
        for optimizer in optimizers:
            optimizer.step()
    moved = lambda ws: sum(int((w.detach() != s).sum()) for w, s in zip(ws, start)) / sum(s.numel() for s in start)
    assert moved(plain) < 0.1 and moved(copied) > 0.9, (moved(plain), moved(copied))


@pytest.mark.parametrize("dtype", sorted(HALF))
def test_a_saved_state_resumes_in_float32_exactly_as_if_never_stopped(dtype, tmp_path):
    weights = _weights(3, HALF[dtype])
    optimizer = MasterWeightAdamW(weights, **_settings(1e-4, 0.01))
    grads = _gradients(3, weights, 6)
    for step, step_grads in enumerate(grads):
        if step == 3:  # stop, save, and resume into fresh weights loaded from the model's (rounded) weights
            torch.save(optimizer.state_dict(), tmp_path / "optimizer.pt")
            uninterrupted = weights
            weights = [torch.nn.Parameter(w.detach().clone()) for w in weights]
            resumed = MasterWeightAdamW(weights, **_settings(1e-4, 0.01))
            resumed.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))
            for w in weights:
                assert all(resumed.state[w][key].dtype == torch.float32 for key in (MASTER, "exp_avg", "exp_avg_sq"))
        for w, g in zip(weights, step_grads):
            w.grad = g
        (optimizer if step < 3 else resumed).step()
        if step >= 3:
            for w, g in zip(uninterrupted, step_grads):
                w.grad = g
            optimizer.step()
    for w, u in zip(weights, uninterrupted):
        assert torch.equal(w.detach(), u.detach())
        assert torch.equal(resumed.state[w][MASTER], optimizer.state[u][MASTER])


def test_a_state_saved_without_copies_starts_them_from_the_weights():
    """A checkpoint of optim.master_weights none resumed with copies: they start from the weights as loaded."""
    weights = _weights(5, torch.bfloat16)
    plain = torch.optim.AdamW(weights, **_settings(1e-3, 0.0))
    for w in weights:
        w.grad = torch.ones_like(w)
    plain.step()
    resumed = MasterWeightAdamW(weights, **_settings(1e-3, 0.0))
    resumed.load_state_dict(plain.state_dict())
    before = [w.detach().float() for w in weights]
    resumed.step()
    for w, b in zip(weights, before):
        assert resumed.state[w][MASTER].dtype == torch.float32 and int(resumed.state[w]["step"]) == 2
        assert not torch.equal(resumed.state[w][MASTER], b)


@pytest.mark.parametrize("setting, dtype, expected", [
    ("auto", torch.bfloat16, True), ("auto", torch.float16, True), ("auto", torch.float32, False),
    ("float32", torch.float32, True), ("none", torch.bfloat16, False)])
def test_which_runs_step_float32_copies(setting, dtype, expected):
    weights = [torch.nn.Parameter(torch.zeros(2, dtype=dtype))]
    assert needs_master_weights(setting, weights) is expected
    assert isinstance(trained_weights_adamw(setting, weights, lr=1e-3), MasterWeightAdamW) is expected


def test_a_saved_copy_of_another_shape_is_refused_naming_the_file(tmp_path):
    weights = _weights(0, torch.bfloat16)
    optimizer = MasterWeightAdamW(weights, **_settings(1e-3, 0.0))
    for w in weights:
        w.grad = torch.ones_like(w)
    optimizer.step()
    state = optimizer.state_dict()
    check_optimizer_state(state, tmp_path / "optimizer.pt", [tuple(w.shape) for w in weights])
    state["state"][0][MASTER] = torch.zeros(3)
    with pytest.raises(CheckpointError, match=r"optimizer.pt.*float32 copy \(master\)"):
        check_optimizer_state(state, tmp_path / "optimizer.pt", [tuple(w.shape) for w in weights])


def test_with_copies_only_a_learning_rate_of_0_is_said(caplog):
    """float32 copies hold the default learning rate and float16's epsilon: neither the warning nor the refusal
    that torch's AdamW on the 16-bit weights gets (tests/engine/model/test_update_precision_properties.py)."""
    accelerator = Accelerator(cpu=True)
    weights = _weights(0, torch.float16)
    with caplog.at_level(logging.WARNING, logger="grpo_engine"):
        check_update_precision(accelerator, weights, 1e-6, 1e-8, "float16", float32_steps=True)
        assert caplog.records == []
        check_update_precision(accelerator, weights, 0.0, 1e-8, "float16", float32_steps=True)
    (record,) = caplog.records
    assert "optim.learning_rate is 0" in record.getMessage()
