"""A patched model copied (deepcopy: TRL's create_reference_model, a frozen reference; pickle; torch.save) or handed
to patch_causal_lm inside a wrapper (PEFT, DataParallel, DistributedDataParallel, any `.module` wrapper), and a config changed after patching.

Before: a deep copy's plain forward and generate() ran the *original* model's weights (the patch was a closure over
the original's forward), a torch.save'd model came back unpatched while is_patched() said it was patched, a PeftModel
passed itself failed inside transformers, DataParallel was refused, and final_logit_softcapping set after patching was
ignored (the log-probs silently off).
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from integration_models import labelled_batch, logits_path_logps, tiny_causal_lm
from process_groups import world_of_one  # noqa: F401  (a fixture)
from torch import nn

from grpo_kernels.integrations.transformers import is_patched, patch_causal_lm, unpatch_causal_lm

LOGP_ATOL = 2e-5


def _torch_save_roundtrip(model):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


COPIES = {"deepcopy": copy.deepcopy, "pickle": lambda m: pickle.loads(pickle.dumps(m)),
          "torch.save": _torch_save_roundtrip}


@pytest.mark.parametrize("how", sorted(COPIES))
def test_a_copy_of_a_patched_model_runs_its_own_weights_in_every_mode(how):
    original = patch_causal_lm(tiny_causal_lm("llama"), backend="torch")
    duplicate = COPIES[how](original)
    with torch.no_grad():
        duplicate.lm_head.weight.mul_(-3.0)  # the copy now predicts differently from the original
    input_ids, labels = labelled_batch()
    assert is_patched(duplicate) and is_patched(original)
    with torch.no_grad():
        plain = duplicate(input_ids).logits
        assert not torch.allclose(plain, original(input_ids).logits)
        torch.testing.assert_close(plain, type(duplicate).forward(duplicate, input_ids).logits, atol=0, rtol=0)
        out = duplicate(input_ids, labels=labels, return_logprobs=True)
    torch.testing.assert_close(out.logps, logits_path_logps(duplicate, input_ids, labels), atol=LOGP_ATOL, rtol=0)
    generated = duplicate.generate(input_ids[:1], max_new_tokens=4, do_sample=False, pad_token_id=0)
    unpatch_causal_lm(duplicate)
    assert is_patched(original) and not is_patched(duplicate)
    assert torch.equal(generated, duplicate.generate(input_ids[:1], max_new_tokens=4, do_sample=False, pad_token_id=0))


class _ModuleWrapper(nn.Module):
    """A wrapper as DistributedDataParallel, FSDP1 and DeepSpeed's engine are: the model as `.module`."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def _peft(model):
    peft = pytest.importorskip("peft")
    return peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))


WRAPPERS = {"peft": _peft, "DataParallel": nn.DataParallel, "module wrapper": _ModuleWrapper,
            "wrapper of a wrapper": lambda m: _ModuleWrapper(nn.DataParallel(m))}


@pytest.mark.parametrize("wrap", sorted(WRAPPERS))
def test_a_wrapper_has_the_model_inside_patched(wrap):
    wrapper = WRAPPERS[wrap](tiny_causal_lm("qwen2"))
    input_ids, labels = labelled_batch(seed=1)
    expected = logits_path_logps(wrapper, input_ids, labels)
    assert patch_causal_lm(wrapper, backend="torch") is wrapper
    assert is_patched(wrapper)
    out = wrapper(input_ids=input_ids, labels=labels, return_logprobs=True)
    torch.testing.assert_close(out.logps, expected, atol=LOGP_ATOL, rtol=0)
    unpatch_causal_lm(wrapper)
    assert not is_patched(wrapper)


def test_a_distributed_data_parallel_model_is_patched_inside(world_of_one):
    model = tiny_causal_lm("llama")
    ddp = nn.parallel.DistributedDataParallel(model)
    input_ids, labels = labelled_batch(seed=3)
    expected = logits_path_logps(model, input_ids, labels)
    patch_causal_lm(ddp, backend="torch")
    assert is_patched(model)
    out = ddp(input_ids, labels=labels, return_logprobs=True)
    torch.testing.assert_close(out.logps, expected, atol=LOGP_ATOL, rtol=0)
    out.logps.sum().backward()
    assert model.lm_head.weight.grad is not None


@pytest.fixture(scope="module")
def gemma2():
    return patch_causal_lm(tiny_causal_lm("gemma2"), backend="torch")


@settings(max_examples=8, deadline=None)
@given(softcap=st.one_of(st.none(), st.floats(0.25, 50.0)))
def test_a_logit_transform_set_after_patching_is_applied(gemma2, softcap):
    gemma2.config.final_logit_softcapping = softcap  # Gemma 2's own forward reads it at each call
    input_ids, labels = labelled_batch(seed=2)
    with torch.no_grad():
        out = gemma2(input_ids, labels=labels, return_logprobs=True)
    torch.testing.assert_close(out.logps, logits_path_logps(gemma2, input_ids, labels), atol=LOGP_ATOL, rtol=0)


def test_a_logit_transform_made_invalid_after_patching_is_refused_before_the_backbone():
    model = patch_causal_lm(tiny_causal_lm("gemma2"), backend="torch")
    calls = []
    model.model.register_forward_pre_hook(lambda *_: calls.append(1))
    model.config.final_logit_softcapping = -1.0
    input_ids, labels = labelled_batch()
    with pytest.raises(ValueError, match=r"^Gemma2ForCausalLM sets config.final_logit_softcapping=-1.0: a soft-cap"):
        model(input_ids, labels=labels, return_logprobs=True)
    assert calls == []
