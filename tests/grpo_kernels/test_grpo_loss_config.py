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


def test_trl_defaults_that_change_the_gradient():
    # Spelled out so that a change of either default is seen here, not only in a trl-dependent test.
    config = GRPOLossConfig()
    assert config.use_bias_correction_kl is True  # TRL's default since 1.10
    assert config.max_completion_length == 512  # dr_grpo's normaliser when not given
