"""The kernels' warnings on a loss combination (TRL's: it does not follow the loss type's paper) reach a run's user
in the engine's keys, once at the start: before, they came as Python warnings naming `loss_type='bnpo'` and
`importance_sampling_level='sequence'` (no keys of the engine), with a file path and a line of code, at every
validation of the config (twice in one run). Each key-value pair a warning names is a value that key takes, and
the advice it ends with, followed, leaves nothing to warn about."""

from __future__ import annotations

import re
import warnings

from hypothesis import given, settings, strategies as st

from grpo_engine.config import flag_value, leaf_keys, load_config
from grpo_engine.run_setup import loss_warnings
from grpo_kernels.config import IMPORTANCE_SAMPLING_LEVELS
from grpo_kernels.losses import loss_type_names

KEYS = set(leaf_keys())
_PAIR = re.compile(r"\b(loss\.[a-z_]+) ([^\s,;]+)")


def _config(overrides: dict):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # loading says nothing as a Python warning
        return load_config(overrides={"data.builtin_max_operand": 2, **overrides})


@settings(max_examples=40, deadline=None)
@given(loss_type=st.sampled_from(loss_type_names()), level=st.sampled_from(IMPORTANCE_SAMPLING_LEVELS))
def test_a_loss_warning_is_said_in_the_engines_keys(loss_type, level):
    config = _config({"loss.loss_type": loss_type, "loss.importance_sampling_level": level})
    with warnings.catch_warnings(record=True) as kernels:
        warnings.simplefilter("always")
        config.loss_config(quiet=False)
    said = loss_warnings(config)
    assert len(said) == len(kernels)
    for line in said:
        assert not re.search(r"\b[a-z_]+=", line), line  # no keyword of the kernels' constructor
        pairs = _PAIR.findall(line)
        assert pairs and all(key in KEYS for key, _ in pairs), line
        for key, value in pairs:
            _config({key: flag_value(key, value)})  # each value named is one its key takes
        key, value = pairs[-1]  # the advice: followed, nothing is left to warn about
        followed = _config({"loss.loss_type": loss_type, "loss.importance_sampling_level": level,
                            key: flag_value(key, value)})
        assert loss_warnings(followed) == []
