"""The schema against what it mirrors: the kernels' loss config and backends; the settings the rollout and the
loss share, held once; a registered loss type's declared hyper-parameters."""

import dataclasses

import pytest

from grpo_engine.config import SHARED_SETTINGS, ConfigError, LossConfig, load_config
from grpo_engine.config import loss_params
from grpo_kernels import GRPOLossConfig


def test_the_loss_section_is_the_kernels_config_less_the_shared_settings():
    kernel = {f.name: f.default for f in dataclasses.fields(GRPOLossConfig)}
    shared = {key.removeprefix("loss.") for key in SHARED_SETTINGS}
    own = set(LossConfig.model_fields)
    # Every kernel field is a key here or the rollout's; the kernel's `loss_params` is the section's `params`.
    assert set(kernel) - shared - {"loss_params"} <= own and not own & shared and own - set(kernel) <= {"params"}
    section = own & set(kernel) - {"params"}
    defaults = LossConfig()
    assert {name: getattr(defaults, name) for name in section} == {name: kernel[name] for name in section}


def test_run_loss_backend_takes_what_the_registry_holds_when_the_config_loads():
    import plugin_backend

    with plugin_backend.registered() as name:  # registered after the engine's config was imported
        assert load_config(overrides={"run.loss_backend": name}).run.loss_backend == name
    with pytest.raises(ConfigError, match=rf"run.loss_backend: .*{name}"):
        load_config(overrides={"run.loss_backend": name})


def test_the_loss_reads_the_rollouts_shared_settings():
    config = load_config(overrides={"rollout.temperature": 0.5, "rollout.max_new_tokens": 40,
                                    "loss.loss_type": "dr_grpo"})
    kernel = config.loss_config()
    assert (kernel.temperature, kernel.max_completion_length) == (0.5, 40)
    config.rollout.temperature = 0.25  # an assignment is validated, and the loss follows it
    assert config.loss_config().temperature == 0.25
    with pytest.raises(ConfigError, match=r"^rollout.temperature: expected a value >= "):  # the one line of a load
        config.rollout.temperature = 0.0


DECLARING = "engine_test_declares_params"  # a registered loss type that declares hyper-parameters


@pytest.fixture()
def declared():
    """A loss type registered with hyper-parameters (register_loss_type's params), unregistered afterwards."""
    from grpo_kernels.losses import LossParam, register_loss_type, unregister_loss_type

    params = {"alpha": 0.5, "window": 4, "symmetric": True, "mode": "mean"}
    register_loss_type(DECLARING, lambda x: -x.ratio * x.advantages, "sequence_mean",
                       params={name: LossParam(default) for name, default in params.items()})
    yield params
    unregister_loss_type(DECLARING)


def test_declared_loss_params_are_filled_checked_and_saved(declared):
    from grpo_engine.config import config_from_yaml, config_yaml

    config = load_config(overrides={"loss.loss_type": DECLARING, "loss.params": {"alpha": 2}})
    assert config.loss.params == {"alpha": 2.0, "window": 4, "symmetric": True, "mode": "mean"}
    assert config.loss_config().loss_params == config.loss.params  # the kernels' config carries them
    assert config_from_yaml(config_yaml(config), "saved") == config


@pytest.mark.parametrize("params, message", [
    ({"alpah": 1.0}, f"loss.params.alpah: not a hyper-parameter of loss type {DECLARING!r} (did you mean loss.params.alpha?)"),
    ({"alpha": "big"}, "loss.params.alpha: expected a finite number (its default is 0.5), got 'big'"),
    ({"alpha": float("nan")}, "loss.params.alpha: expected a finite number"),
    ({"window": 2.5}, "loss.params.window: expected int (its default is 4), got 2.5"),
    ({"symmetric": 1}, "loss.params.symmetric: expected bool (its default is True), got 1"),
])
def test_a_wrong_loss_param_is_refused_naming_it(declared, params, message):
    with pytest.raises(ConfigError) as refused:
        load_config(overrides={"loss.loss_type": DECLARING, "loss.params": params})
    assert str(refused.value).startswith(message)
