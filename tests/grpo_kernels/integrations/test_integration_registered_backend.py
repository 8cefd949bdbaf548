"""A backend registered after grpo_kernels and its integrations are imported (tests/support/plugin_backend.py) is
taken everywhere the README says a backend name is: `patch_causal_lm`, `patch_grpo_trainer`, GRPOKernelsTrainer's
`kernel_backend`, and the registry-parametrized tests (collected with the backend registered by a pytest plugin).

Tolerances as in test_integration_transformers.py / test_integration_trl_loss.py (float32).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys

import plugin_backend
import pytest
import torch
from integration_models import TRANSFORMED_FAMILIES, tiny_causal_lm
from repo_paths import ROOT

from grpo_kernels import routing
from grpo_kernels.backends import BACKENDS, register_backend
from grpo_kernels.integrations import transformers as transformers_integration  # imported before registering


def test_patch_causal_lm_takes_a_backend_registered_after_import():
    model = tiny_causal_lm("qwen2", seed=4)
    generator = torch.Generator().manual_seed(2)
    input_ids = torch.randint(3, model.config.vocab_size, (2, 8), generator=generator)
    labels = input_ids.clone()
    labels[:, :3] = -100
    with plugin_backend.registered() as name:
        transformers_integration.patch_causal_lm(model, backend=name)
        out = model(input_ids, labels=labels, return_logprobs=True)
        out.logps.sum().backward()
        assert plugin_backend.calls == {"forward": 1, "backward": 1}
    grad = model.lm_head.weight.grad.clone()
    model.zero_grad()
    logits = transformers_integration.unpatch_causal_lm(model)(input_ids).logits.float()
    expected = torch.log_softmax(logits[:, :-1], -1).gather(-1, labels[:, 1:].clamp(min=0)[..., None])[..., 0]
    expected = expected * (labels[:, 1:] != -100)
    torch.testing.assert_close(out.logps, expected, atol=2e-5, rtol=0)
    expected.sum().backward()
    torch.testing.assert_close(grad, model.lm_head.weight.grad, atol=1e-4 * float(grad.abs().max()) + 1e-7, rtol=0)
    with pytest.raises(ValueError, match="backend must be one of"):  # gone from the registry: refused again
        transformers_integration.patch_causal_lm(model, backend=name)


def test_patch_grpo_trainer_takes_a_backend_registered_after_import(tmp_path):
    trl = pytest.importorskip("trl")
    from integration_models import tiny_grpo_trainer

    from grpo_kernels.integrations.trl import GRPOKernelsTrainer, patch_grpo_trainer

    model = tiny_causal_lm("qwen2", seed=3)
    with plugin_backend.registered() as name:
        trainer = patch_grpo_trainer(tiny_grpo_trainer(trl.GRPOTrainer, model, tmp_path / "patched"), backend=name)
        trainer.train()
        assert plugin_backend.calls["forward"] > 0 and plugin_backend.calls["backward"] > 0
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
        with pytest.raises(ValueError, match="kernel_backend must be one of"):
            GRPOKernelsTrainer(model=None, kernel_backend=name + "_not_registered")


@pytest.fixture
def without_transforms():
    """The plugin registered as a backend whose entry takes no logit transform."""
    spec = dataclasses.replace(plugin_backend.SPEC, name="plugin_no_transforms", logit_transforms=False)
    register_backend(spec)
    yield spec.name
    BACKENDS.pop(spec.name, None)
    routing._cached_route.cache_clear()


@pytest.mark.parametrize("family", ["gemma2", "cohere", "granite", "llama"])
def test_a_backend_that_cannot_run_the_models_head_is_refused_when_patching(without_transforms, family, tmp_path):
    # Before: patched, then refused at the first call after the backbone had run (under TRL: after generating)
    model = tiny_causal_lm(family)
    if family not in TRANSFORMED_FAMILIES:  # an identity head: taken
        assert transformers_integration.is_patched(transformers_integration.patch_causal_lm(
            model, backend=without_transforms))
        return
    refusal = rf"^backend='{without_transforms}' does not support a logit_transform other than the identity "
    with pytest.raises(ValueError, match=refusal):
        transformers_integration.patch_causal_lm(model, backend=without_transforms)
    assert not transformers_integration.is_patched(model)
    if family == "gemma2" and importlib.util.find_spec("trl") is not None:  # the same through a trainer instance
        import trl
        from integration_models import tiny_grpo_trainer

        from grpo_kernels.integrations.trl import patch_grpo_trainer
        trainer = tiny_grpo_trainer(trl.GRPOTrainer, model, tmp_path / "refused")
        with pytest.raises(ValueError, match=refusal):
            patch_grpo_trainer(trainer, backend=without_transforms)


@pytest.mark.slow
def test_a_plugin_backend_is_collected_by_the_registry_parametrized_tests():
    """`pytest -p plugin_backend` registers the backend before collection: the conformance, loss-type and compile
    tests then include it, none of them edited."""
    files = ["tests/grpo_kernels/test_backend_conformance.py", "tests/grpo_kernels/test_loss_types.py",
             "tests/grpo_kernels/test_compile.py"]
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "plugin_backend",
                             "-p", "no:cacheprovider", *files], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stdout[-3000:] + listed.stderr[-3000:]
    ids = listed.stdout.splitlines()
    for path in files:
        assert any(line.startswith(path) and plugin_backend.NAME in line for line in ids), path


@pytest.mark.slow
def test_the_plugin_backend_passes_the_conformance_edges():
    """And those tests pass on it: a sample of the conformance edges, run with the plugin."""
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "plugin_backend", "-p", "no:cacheprovider",
                          "tests/grpo_kernels/test_backend_conformance.py", "-k",
                          f"{plugin_backend.NAME} and (float32 or packed or bias_int or hidden_nan)"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and " failed" not in run.stdout
