"""Each loss setting is declared once, beside its GRPOLossConfig field (type, bounds, meaning): the kernels' checks,
the engine's `loss` section (and so its flags and --help) and FusedLinearGRPOLoss's constructor are derived from the
declaration. A loss type's own hyper-parameters (sapo's, vespo's, a registered type's) go through one mechanism,
LossParam / loss_params, with TRL's and Liger's names kept as aliases at those boundaries."""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
from pydantic import create_model

from grpo_engine.config import ConfigError, EngineConfig, config_from_yaml, leaf_fields, load_config
from grpo_engine.config.strict_yaml import dump_yaml
from grpo_engine.config.schema import SHARED_SETTINGS, loss_section
from grpo_kernels import FusedLinearGRPOLoss, GRPOLossConfig
from grpo_kernels.config import setting
from grpo_kernels.losses import LossParam, get_loss_type, register_loss_type, unregister_loss_type
from grpo_kernels.module import liger_config, liger_signature

DECLARED = [f for f in dataclasses.fields(GRPOLossConfig) if "setting" in f.metadata]
BOUNDED = [f for f in DECLARED if any(getattr(f.metadata["setting"], k) is not None for k in ("ge", "gt", "le"))]


def past_the_bound(declaration) -> float:
    if declaration.ge is not None:
        return declaration.ge - 0.5
    if declaration.gt is not None:
        return declaration.gt
    return declaration.le + 0.5


@pytest.mark.parametrize("f", DECLARED, ids=[f.name for f in DECLARED])
def test_every_declared_setting_is_in_the_engine_section_as_declared(f):
    if f"loss.{f.name}" in SHARED_SETTINGS:  # the rollout's setting holds it
        assert f.name not in EngineConfig.model_fields["loss"].annotation.model_fields
        return
    field = leaf_fields()[f"loss.{f.name}"]
    assert field.description == f.metadata["setting"].help and field.default == f.default


@pytest.mark.parametrize("f", BOUNDED, ids=[f.name for f in BOUNDED])
def test_a_value_past_a_declared_bound_is_refused_by_the_kernels_and_the_engine(f):
    value = past_the_bound(f.metadata["setting"])
    value = int(value) if f.type in ("Optional[int]", "int") else value
    with pytest.raises(ValueError, match=f"^{f.name} must be"):
        GRPOLossConfig(**{f.name: value})
    if f"loss.{f.name}" not in SHARED_SETTINGS:
        with pytest.raises(ConfigError, match=f"^loss.{f.name}: expected a value"):
            load_config(overrides={f"loss.{f.name}": value})


def test_a_setting_added_in_one_place_appears_in_the_engine_config_its_help_and_the_module():
    @dataclasses.dataclass(frozen=True)
    class WithKnob(GRPOLossConfig):
        knob: float = setting(0.5, "a test's own loss setting", ge=0.0)

    with pytest.raises(ValueError, match="knob must be >= 0, got -1.0"):
        WithKnob(knob=-1.0)
    section = loss_section(WithKnob)
    assert section.model_validate({"knob": 0.7}).knob == 0.7
    engine = create_model("WithKnobConfig", __base__=EngineConfig, loss=(section, section()))
    assert leaf_fields(engine)["loss.knob"].description == "a test's own loss setting"  # its --loss.knob help
    with pytest.raises(ValueError, match="knob"):
        engine.model_validate({"loss": {"knob": -1.0}})
    signature = liger_signature(WithKnob)
    assert signature.parameters["knob"].default == 0.5
    config, _ = liger_config(WithKnob, signature, knob=0.25)
    assert config.knob == 0.25 and config.beta == 0.04  # Liger's default at its boundary


def test_sapo_and_vespo_declare_their_hyper_parameters_as_any_loss_type_and_keep_trl_names_as_aliases():
    sapo = GRPOLossConfig(loss_type="sapo", sapo_temperature_pos=2.0)
    assert sapo.loss_params == {"temperature_pos": 2.0, "temperature_neg": 1.05} and sapo.sapo_temperature_pos == 2.0
    assert GRPOLossConfig(loss_type="dapo", sapo_temperature_pos=2.0).loss_params == {}  # not read, as in TRL
    # refused by the name the caller wrote, TRL's
    with pytest.raises(ValueError, match="^vespo_lambda_pos: loss_type 'vespo' expected a finite number > 0"):
        GRPOLossConfig(loss_type="vespo", vespo_lambda_pos=-1.0)
    with pytest.raises(ValueError, match="^loss_params.lambda_pos: loss_type 'vespo' expected a finite number > 0"):
        GRPOLossConfig(loss_type="vespo", loss_params={"lambda_pos": -1.0})
    with pytest.raises(ValueError, match="set the same hyper-parameter"):
        GRPOLossConfig(loss_type="sapo", sapo_temperature_pos=2.0, loss_params={"temperature_pos": 3.0})
    module = FusedLinearGRPOLoss(loss_type="vespo", vespo_k_pos=1.5)
    assert module.config.loss_params["k_pos"] == 1.5
    engine = load_config(overrides={"loss.loss_type": "sapo", "loss.params": {"temperature_neg": 2.0}})
    assert engine.loss_config() == GRPOLossConfig(loss_type="sapo", sapo_temperature_neg=2.0,
                                                  max_completion_length=256)
    with pytest.raises(ConfigError, match=r"^loss.sapo_temperature_pos \(2.0\) is read only with loss.loss_type "
                                          r"sapo, where it is loss.params.temperature_pos$"):
        load_config(overrides={"loss.sapo_temperature_pos": 2.0})


def test_a_config_saved_with_trl_names_of_sapo_and_vespo_settings_reads_back(tmp_path):
    """config.yaml of a run saved when the engine held them as loss.sapo_* / loss.vespo_* (every key written, at
    its default where unread) still loads, for --resume: the chosen type's values become loss.params."""
    old = {"loss_type": "sapo", "sapo_temperature_pos": 2.0, "sapo_temperature_neg": 1.05, "vespo_k_pos": 2.0,
           "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0, "vespo_lambda_neg": 2.0}
    assert config_from_yaml(dump_yaml({"loss": old}), "config.yaml").loss.params == {"temperature_pos": 2.0,
                                                                                     "temperature_neg": 1.05}
    old.update(loss_type="dapo", sapo_temperature_pos=1.0)  # what a dapo run saved: every default
    assert config_from_yaml(dump_yaml({"loss": old}), "config.yaml") == load_config()


def _scaled_term(x):
    return -x.config.loss_params["alpha"] * x.ratio * x.advantages


def test_a_registered_loss_type_param_appears_in_the_engine_config_and_the_module():
    register_loss_type("alpha_scaled", _scaled_term, "sequence_mean",
                       params={"alpha": LossParam(0.5, float, minimum=0.0, alias="alpha_scaled_alpha",
                                                  help="the term's scale")})
    try:
        config = load_config(overrides={"loss.loss_type": "alpha_scaled", "loss.params": {"alpha": 0.7}})
        assert config.loss.params == {"alpha": 0.7} and config.loss_config().loss_params == {"alpha": 0.7}
        with pytest.raises(ConfigError, match="loss.params.alpha"):
            load_config(overrides={"loss.loss_type": "alpha_scaled", "loss.params": {"alpha": -1.0}})
        assert FusedLinearGRPOLoss(loss_type="alpha_scaled", loss_params={"alpha": 0.9}).config.loss_params == {
            "alpha": 0.9}
        by_alias = GRPOLossConfig(loss_type="alpha_scaled", alpha_scaled_alpha=0.3)
        assert by_alias.loss_params == {"alpha": 0.3} and by_alias.alpha_scaled_alpha == 0.3
        assert math.isclose(get_loss_type("alpha_scaled").params["alpha"].default, 0.5)
    finally:
        unregister_loss_type("alpha_scaled")


def test_the_module_keeps_liger_names_order_and_defaults():
    parameters = inspect.signature(FusedLinearGRPOLoss.__init__).parameters
    assert parameters["beta"].default == 0.04 and parameters["epsilon_low"].default == 0.2
    assert parameters["use_bias_correction_kl"].default is False and "epsilon" not in parameters
    module = FusedLinearGRPOLoss(0.1, True, True, 1, 0.1, 0.3, "grpo")  # positional, as Liger's
    assert (module.config.beta, module.config.epsilon, module.config.epsilon_high) == (0.1, 0.1, 0.3)
