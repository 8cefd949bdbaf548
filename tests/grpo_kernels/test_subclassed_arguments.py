"""A caller's subclass of the library's own argument types gives one answer on every backend, or one refusal.

A GRPOLossConfig subclass (a setting of the caller's own, which a registered loss type's term may read) reaches the
objective as the caller's class on every route; before, the fused routes rebuilt it as a plain GRPOLossConfig and
failed ("GRPOLossConfig() got an unexpected keyword argument") where the two-step route ran. A LogitTransform
subclass redefining apply() or is_identity is refused: the fused backends compute the transform from its scale and softcap alone,
so before the reference applied the subclass's transform and every other backend silently did not.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from grpo_testing import FUSED_BACKENDS, make_problem, registered_backends, run_loss, with_triton_interpreted

import grpo_kernels
from grpo_kernels import FusedLinearGRPOLoss, GRPOLossConfig, LogitTransform, fused_linear_grpo_loss, linear_logprobs
from grpo_kernels.config import setting
from grpo_kernels.losses import TermInputs, unregister_loss_type

BACKENDS = with_triton_interpreted(registered_backends())


@dataclasses.dataclass(frozen=True)
class TaggedConfig(GRPOLossConfig):
    run_name: str = "baseline"  # the caller's metadata, carried with the config
    advantage_scale: float = setting(1.0, "a registered term's own knob", ge=0.0)


def scaled_term(x: TermInputs) -> torch.Tensor:
    clipped = x.ratio.clamp(1 - x.config.epsilon_low, 1 + x.config.epsilon_high_value)
    scale = getattr(x.config, "advantage_scale", 1.0)
    return -(x.ratio * x.advantages * scale).minimum(clipped * x.advantages * scale)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_config_subclass_gives_its_base_configs_loss_on_every_backend(backend):
    p = make_problem(2, B=2, T=4, H=16, V=40)
    for loss_type in ("dapo", "grpo"):
        base = GRPOLossConfig(loss_type=loss_type, beta=0.04)
        tagged = TaggedConfig(loss_type=loss_type, beta=0.04, run_name="a run")
        out, grads = run_loss(fused_linear_grpo_loss, p, tagged, backend=backend)
        expected, expected_grads = run_loss(fused_linear_grpo_loss, p, base, backend=backend)
        torch.testing.assert_close(out.loss, expected.loss)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, expected_grads[name])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_registered_term_reads_the_subclass_setting_on_every_backend(backend):
    grpo_kernels.register_loss_type("scaled", scaled_term, "local_token_mean", token_level=True,
                                    clip="trust_region")
    try:
        p = make_problem(4, B=2, T=4, H=16, V=40)
        doubled, _ = run_loss(fused_linear_grpo_loss, p, TaggedConfig(loss_type="scaled", advantage_scale=2.0),
                              backend=backend)
        once, _ = run_loss(fused_linear_grpo_loss, p, TaggedConfig(loss_type="scaled"), backend=backend)
        torch.testing.assert_close(doubled.loss, 2 * once.loss)
    finally:
        unregister_loss_type("scaled")


class Doubled(LogitTransform):
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return super().apply(logits) * 2.0


class AlwaysIdentity(LogitTransform):
    @property
    def is_identity(self) -> bool:
        return True


@pytest.mark.parametrize("backend", ["auto", "reference", *FUSED_BACKENDS])
@pytest.mark.parametrize("transform", [Doubled(), AlwaysIdentity(scale=2.0)], ids=["apply", "is_identity"])
@pytest.mark.parametrize("entry", ["loss", "logprobs"])
def test_a_transform_subclass_redefining_what_it_does_is_refused(backend, transform, entry):
    p = make_problem(0, B=2, T=4, H=16, V=40)
    redefined = "apply" if isinstance(transform, Doubled) else "is_identity"
    with pytest.raises(TypeError, match=rf"^logit_transform: {type(transform).__name__} redefines LogitTransform."
                                        rf"{redefined}, which the fused backends do not follow"):
        if entry == "logprobs":
            linear_logprobs(p.hidden, p.weight, p.completion_ids, backend=backend, logit_transform=transform)
        else:
            fused_linear_grpo_loss(p.hidden, p.weight, p.completion_ids, p.completion_mask, p.advantages,
                                   old_logps=p.old_logps, backend=backend, logit_transform=transform)


def test_a_transform_subclass_that_only_names_itself_is_taken():
    class Gemma2Cap(LogitTransform):
        """The caller's name for its model's transform; the same two numbers."""

    p = make_problem(0, B=2, T=4, H=16, V=40)
    got = linear_logprobs(p.hidden, p.weight, p.completion_ids, logit_transform=Gemma2Cap(softcap=30.0))
    expected = linear_logprobs(p.hidden, p.weight, p.completion_ids, logit_transform=LogitTransform(softcap=30.0))
    torch.testing.assert_close(got, expected)


def test_the_module_takes_a_config_subclass():
    p = make_problem(1, B=2, T=4, H=16, V=40)
    module = FusedLinearGRPOLoss(beta=0.04)
    expected = module(p.hidden, p.weight, p.completion_ids, p.completion_mask, p.advantages,
                      ref_per_token_logps=p.ref_logps)[0]
    module.config = TaggedConfig(**{f.name: getattr(module.config, f.name) for f in dataclasses.fields(GRPOLossConfig)},
                                 run_name="a run")
    module.beta = 0.04  # rebuilt as the caller's class, its own fields kept
    assert isinstance(module.config, TaggedConfig) and module.config.run_name == "a run"
    torch.testing.assert_close(module(p.hidden, p.weight, p.completion_ids, p.completion_mask, p.advantages,
                                      ref_per_token_logps=p.ref_logps)[0], expected)
