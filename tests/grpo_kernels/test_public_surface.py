"""The public surface: every name the README's API table tells users to call is exported by `grpo_kernels`; the
functions' options are keyword-only, and the positional use they allowed before still works for now with a
FutureWarning naming the parameters."""

import inspect
import re
import warnings

import pytest
import torch
from grpo_testing import make_problem
from repo_paths import ROOT

import grpo_kernels
from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, grpo_loss_from_logits, linear_logprobs


def api_table_names() -> list[str]:
    """The leading name of each row of the README's API table (`reference.x / y / z` gives reference.x, ...)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## API\n", 1)[1]
    table = section[section.index("| name |"):].split("\n\n", 1)[0]
    names = []
    for cell in re.findall(r"^\| `([^`]+)` \|", table, flags=re.MULTILINE):
        first, *others = cell.split("(", 1)[0].split(" / ")
        module, _, first = first.rpartition(".")
        names += [f"{module}.{name.strip()}" if module else name.strip() for name in [first, *others]]
    return names


def test_every_name_the_api_table_names_is_exported():
    names = api_table_names()
    assert {"register_backend", "register_loss_type", "fused_linear_grpo_loss"} <= set(names), names
    for dotted in names:
        value = grpo_kernels
        for part in dotted.split("."):
            value = getattr(value, part)
        assert callable(value) or inspect.ismodule(value), dotted
        assert dotted.split(".")[0] in grpo_kernels.__all__, dotted


def test_the_values_those_calls_take_are_exported():
    """register_backend(BackendSpec(...)) and register_loss_type(..., params={...: LossParam(...)}), as the table
    writes them, with the package's names only."""
    assert {"BackendSpec", "LossParam", "backend_names"} <= set(grpo_kernels.__all__)
    assert grpo_kernels.LossParam(1.0, float, minimum=0.0).default == 1.0
    spec = grpo_kernels.BackendSpec("exported_spec", "grpo_kernels.backends.torch_streaming", "a copy")
    try:
        assert grpo_kernels.register_backend(spec) is spec and "exported_spec" in grpo_kernels.backend_names()
    finally:
        grpo_kernels.backends.BACKENDS.pop("exported_spec")


@pytest.mark.parametrize("function, required", [(fused_linear_grpo_loss, 5), (linear_logprobs, 3),
                                                (grpo_loss_from_logits, 4)])
def test_options_are_keyword_only(function, required):
    parameters = list(inspect.signature(function).parameters.values())
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters[:required])
    assert parameters[required:] and all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[required:])


def test_positional_options_still_work_with_a_warning_naming_them():
    p = make_problem(seed=3, B=2, T=4, H=8, V=20)
    config = GRPOLossConfig(beta=0.04)
    expected = fused_linear_grpo_loss(p.hidden, p.weight, p.completion_ids, p.completion_mask, p.advantages,
                                      bias=p.bias, old_logps=p.old_logps, ref_logps=p.ref_logps, config=config,
                                      backend="torch")
    with pytest.warns(FutureWarning, match=r"passing bias, old_logps, ref_logps by position is deprecated"):
        got = fused_linear_grpo_loss(p.hidden, p.weight, p.completion_ids, p.completion_mask, p.advantages, p.bias,
                                     p.old_logps, p.ref_logps, config=config, backend="torch")
    torch.testing.assert_close(got.loss, expected.loss, rtol=0, atol=0)
    with pytest.warns(FutureWarning, match=r"linear_logprobs\(\): passing bias by position"):
        logps = linear_logprobs(p.hidden, p.weight, p.completion_ids, p.bias, backend="torch")
    torch.testing.assert_close(logps, linear_logprobs(p.hidden, p.weight, p.completion_ids, bias=p.bias,
                                                      backend="torch"), rtol=0, atol=0)
    with pytest.raises(TypeError, match="multiple values for \\['bias'\\]"):
        linear_logprobs(p.hidden, p.weight, p.completion_ids, p.bias, bias=p.bias)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # keyword use: no warning
        linear_logprobs(p.hidden, p.weight, p.completion_ids, bias=p.bias, backend="torch")
