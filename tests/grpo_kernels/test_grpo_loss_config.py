"""GRPOLossConfig's defaults are TRL 1.16's GRPOConfig defaults, field by field."""

import dataclasses

import pytest

from grpo_kernels import GRPOLossConfig
from grpo_kernels.config import OWN_FIELDS

TRL_FIELDS = [f for f in dataclasses.fields(GRPOLossConfig) if f.name not in OWN_FIELDS]


@pytest.fixture(scope="module")
def trl_default_args(tmp_path_factory):
    """A real `trl.GRPOConfig()`: only the machine-level options that a CPU needs are set."""
    trl = pytest.importorskip("trl", reason="trl is not installed: no GRPOConfig to compare the defaults with")
    return trl.GRPOConfig(output_dir=str(tmp_path_factory.mktemp("grpo_config")), use_cpu=True)


def test_every_field_is_a_trl_grpo_config_field(trl_default_args):
    missing = [f.name for f in TRL_FIELDS if not hasattr(trl_default_args, f.name)]
    assert not missing, f"GRPOLossConfig fields that trl.GRPOConfig lacks: {missing}"


def test_every_default_is_trl_grpo_config_default(trl_default_args):
    ours = GRPOLossConfig()
    differing = {f.name: (getattr(ours, f.name), getattr(trl_default_args, f.name))
                 for f in TRL_FIELDS
                 if getattr(ours, f.name) != getattr(trl_default_args, f.name)}
    assert not differing, f"defaults (ours, TRL's) that differ: {differing}"


def test_from_trl_of_default_args_is_the_default_config(trl_default_args):
    assert GRPOLossConfig.from_trl(trl_default_args) == GRPOLossConfig()


def test_the_defaults_that_change_the_gradient_act_on_it():
    """The default config weights the KL by the importance ratio (use_bias_correction_kl) and divides dr_grpo by
    its max_completion_length: the loss is that of the setting named explicitly, and differs from the other."""
    import torch

    from grpo_kernels import grpo_objective

    generator = torch.Generator().manual_seed(0)
    logps = -torch.rand(2, 5, generator=generator, dtype=torch.float64) - 0.1
    old, ref = logps - 0.3, logps + 0.2
    mask, advantages = torch.ones(2, 5, dtype=torch.float64), torch.tensor([1.0, -0.5], dtype=torch.float64)

    def loss(**settings):
        config = GRPOLossConfig(beta=0.04, **settings)
        return grpo_objective(logps, torch.zeros_like(logps), mask, advantages, config, old_logps=old,
                              ref_logps=ref)[0]

    default = GRPOLossConfig()
    assert loss() == loss(use_bias_correction_kl=default.use_bias_correction_kl)
    assert loss() != loss(use_bias_correction_kl=not default.use_bias_correction_kl)
    dr_grpo = loss(loss_type="dr_grpo")
    assert dr_grpo == loss(loss_type="dr_grpo", max_completion_length=default.max_completion_length)
    assert torch.isclose(loss(loss_type="dr_grpo", max_completion_length=2 * default.max_completion_length),
                         dr_grpo / 2, rtol=1e-12)
