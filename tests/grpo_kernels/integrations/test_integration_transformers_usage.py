"""A patched model used in unusual ways: keywords of the patched forward mistyped, something around the LM head's
forward that the fused head would not run (hooks, an instance forward, the old weight_norm, pruning), and a forward
wrapped after patching (accelerate's mixed-precision wrapper) then unwrapped or unpatched.

Before: a mistyped `return_logprob=True` / `lm_head_func=fn` went on to the model's forward, whose **kwargs took it,
and the plain logits came back (`return_entropies`, `temprature` were silently not applied); the log-probs ignored
every hook on the head (a stale weight under weight_norm, the logits a hook changed); unpatching a forward wrapped since
dropped the wrapper; and accelerate's `unwrap_model(keep_fp32_wrapper=False)` bound the patch as a method, the model
then arriving as input_ids.
"""

from __future__ import annotations

import functools
import re
import warnings

import pytest
import torch
import torch.nn.utils.prune
from hypothesis import given, settings
from hypothesis import strategies as st
from integration_models import VOCAB_SIZE, labelled_batch, logits_path_logps, tiny_causal_lm

from grpo_kernels.integrations.forward_call import HEAD_MODE_KEYWORDS
from grpo_kernels.integrations.transformers import is_patched, patch_causal_lm, unpatch_causal_lm

LOGP_ATOL = 2e-5


@pytest.fixture(scope="module")
def counted_model():
    """A patched model and the list its backbone appends to at each call."""
    model = patch_causal_lm(tiny_causal_lm("llama"), backend="torch")
    calls: list[int] = []
    model.model.register_forward_pre_hook(lambda *_: calls.append(1))
    return model, calls


LETTERS = "abcdefghijklmnopqrstuvwxyz_"


@st.composite
def one_letter_slips(draw) -> tuple[str, str]:
    """(a head-mode keyword, that keyword with one letter deleted, inserted, replaced or two swapped, or none, then
    spelled as a dict of keywords from a config file or a command line may hold it: in capitals, with hyphens)."""
    name = draw(st.sampled_from(HEAD_MODE_KEYWORDS))
    at = draw(st.integers(0, len(name) - 2))
    letter = draw(st.sampled_from(LETTERS))
    slip = draw(st.sampled_from(["delete", "insert", "replace", "swap", "none"]))
    typo = {"delete": name[:at] + name[at + 1:], "insert": name[:at] + letter + name[at:],
            "replace": name[:at] + letter + name[at + 1:], "swap": name[:at] + name[at + 1] + name[at] + name[at + 2:],
            "none": name}[slip]
    spelled = draw(st.sampled_from([str, str.upper, str.title, lambda text: text.replace("_", "-")]))(typo)
    return name, spelled


@settings(max_examples=40, deadline=None)
@given(slip=one_letter_slips(), head_mode=st.booleans())
def test_a_slip_of_a_head_mode_keyword_is_refused_naming_it_before_any_forward(counted_model, slip, head_mode):
    model, calls = counted_model
    name, typo = slip
    if typo in HEAD_MODE_KEYWORDS:  # a swap of two equal letters, or the name itself
        return
    input_ids, labels = labelled_batch()
    mode = {"labels": labels, "return_logprobs": True} if head_mode else {}
    calls.clear()
    with pytest.raises(TypeError, match=rf"^LlamaForCausalLM.forward\(\) got an unexpected keyword argument "
                                        rf"'{re.escape(typo)}'; did you mean '{name}'\?"):
        model(input_ids, **mode, **{typo: True})
    assert calls == []


def test_the_keywords_transformers_takes_are_not_taken_for_slips(counted_model):
    """transformers' own keywords (TransformersKwargs, the forward's names, TRL's) pass as before."""
    from transformers.utils import TransformersKwargs

    model, _ = counted_model
    input_ids, labels = labelled_batch()
    passed = {"output_hidden_states": True, "output_attentions": False, "return_dict": True, "use_cache": False}
    with torch.no_grad():
        plain = model(input_ids, **passed)
        out = model(input_ids, labels=labels, return_logprobs=True, **passed)
    assert plain.logits.shape[-1] == VOCAB_SIZE and out.logps.shape == (2, 6)
    from grpo_kernels.integrations.forward_call import refuse_mistyped_head_keywords

    others = ["return_loss", "num_items_in_batch", "shift_labels", "token_type_ids", "cache_position", "return_dict"]
    refuse_mistyped_head_keywords(model, dict.fromkeys([*TransformersKwargs.__annotations__, *others]))


def _weight_norm(head):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated in favour of the parametrization, which is what we ask for
        torch.nn.utils.weight_norm(head)


def _doubled_forward(head):
    forward = head.forward
    head.forward = lambda hidden: forward(hidden) * 2


AROUND_THE_HEAD = {
    "forward hook": (lambda head: head.register_forward_hook(lambda module, args, output: output * 0.5),
                     "a forward hook"),
    "forward pre-hook": (lambda head: head.register_forward_pre_hook(lambda module, args: (args[0] * 3,)),
                         "a forward pre-hook"),
    "backward hook": (lambda head: head.register_full_backward_hook(lambda module, g_in, g_out: g_in),
                      "a backward hook"),
    "backward pre-hook": (lambda head: head.register_full_backward_pre_hook(lambda module, g_out: g_out),
                          "a backward pre-hook"),
    "old weight_norm": (_weight_norm, r"a forward pre-hook \(WeightNorm\)"),
    "pruning": (lambda head: torch.nn.utils.prune.l1_unstructured(head, "weight", amount=0.3),
                r"a forward pre-hook \(L1Unstructured\)"),
    "instance forward": (_doubled_forward, "its forward replaced on the instance"),
}


@pytest.mark.parametrize("when", ["before patching", "after patching"])
@pytest.mark.parametrize("kind", sorted(AROUND_THE_HEAD))
def test_what_the_fused_head_would_not_run_around_the_head_is_refused_by_name(kind, when):
    add, message = AROUND_THE_HEAD[kind]
    model = tiny_causal_lm("llama")
    pattern = rf"^the LM head Linear has {message}"
    if when == "before patching":
        add(model.lm_head)
        with pytest.raises(TypeError, match=pattern):
            patch_causal_lm(model, backend="torch")
        return
    patch_causal_lm(model, backend="torch")
    add(model.lm_head)
    calls = []
    model.model.register_forward_pre_hook(lambda *_: calls.append(1))
    input_ids, labels = labelled_batch()
    for mode in ({"labels": labels, "return_logprobs": True}, {"lm_head_fn": lambda h, w, b: w}):
        with pytest.raises(TypeError, match=pattern):
            model(input_ids, **mode)
    assert calls == []
    with torch.no_grad():
        model(input_ids)  # the model's own forward runs the head, hooks and all


def test_the_hooks_of_engines_that_only_place_the_weight_are_kept():
    """accelerate's device placement (an instance forward and its hook), and hooks defined by DeepSpeed, FSDP2,
    transformers or TRL: the log-probs are the model's."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    model = tiny_causal_lm("qwen2")
    add_hook_to_module(model.lm_head, AlignDevicesHook(io_same_device=True))
    for owner in ("deepspeed.runtime.zero.parameter_offload", "torch.distributed.fsdp._fully_shard._fsdp_state",
                  "transformers.modeling_utils", "trl.models.activation_offloading"):
        def hook(module, args):
            return None
        hook.__module__ = owner
        model.lm_head.register_forward_pre_hook(hook)
    patch_causal_lm(model, backend="torch")
    input_ids, labels = labelled_batch(seed=1)
    out = model(input_ids, labels=labels, return_logprobs=True)
    torch.testing.assert_close(out.logps, logits_path_logps(model, input_ids, labels), atol=LOGP_ATOL, rtol=0)


def _wrap_as_accelerate_does(model):
    """Accelerator.prepare_model's mixed-precision forward (no Accelerator: its state is process-wide)."""
    from accelerate.utils import convert_outputs_to_fp32

    model._original_forward = model.forward
    forward = model.forward
    model.forward = convert_outputs_to_fp32(functools.wraps(forward)(lambda *a, **k: forward(*a, **k)))
    return model


def test_unpatching_a_forward_wrapped_since_is_refused_and_accelerates_unwrapping_keeps_the_patch():
    from accelerate.utils import extract_model_from_parallel

    model = _wrap_as_accelerate_does(patch_causal_lm(tiny_causal_lm("llama"), backend="torch"))
    input_ids, labels = labelled_batch(seed=2)
    expected = logits_path_logps(model, input_ids, labels)
    with pytest.raises(ValueError, match=r"^LlamaForCausalLM.forward was replaced after patch_causal_lm \(by "
                                         r"convert_outputs_to_fp32.<locals>.forward\), and unpatching would drop"):
        unpatch_causal_lm(model)
    model = extract_model_from_parallel(model, keep_fp32_wrapper=False)  # binds the patch as a method of the model
    assert is_patched(model)
    with torch.no_grad():
        out = model(input_ids, labels=labels, return_logprobs=True)
        plain = model(input_ids).logits
    torch.testing.assert_close(out.logps, expected, atol=LOGP_ATOL, rtol=0)
    unpatch_causal_lm(model)
    assert not is_patched(model) and "forward" not in vars(model)
    torch.testing.assert_close(model(input_ids).logits, plain, atol=0, rtol=0)


@pytest.fixture(scope="module")
def eager_model():
    """Eager attention: the one that returns attention weights."""
    return patch_causal_lm(tiny_causal_lm("llama", attn_implementation="eager"), backend="torch")


@settings(max_examples=12, deadline=None)
@given(hidden=st.booleans(), attentions=st.booleans(), return_dict=st.sampled_from([None, True, False]),
       head_mode=st.sampled_from(["return_logprobs", "lm_head_fn"]))
def test_the_hidden_states_and_attentions_asked_for_come_back_in_the_head_modes(eager_model, hidden, attentions,
                                                                                 return_dict, head_mode):
    """output_hidden_states / output_attentions were taken and their results dropped (no such field came back)."""
    input_ids, labels = labelled_batch(seed=3)
    asked = {"output_hidden_states": hidden, "output_attentions": attentions}
    if return_dict is not None:
        asked["return_dict"] = return_dict
    mode = {"labels": labels, "return_logprobs": True} if head_mode == "return_logprobs" else \
        {"lm_head_fn": lambda h, w, b: None}
    with torch.no_grad():
        plain = eager_model(input_ids, output_hidden_states=hidden, output_attentions=attentions)
        out = eager_model(input_ids, **mode, **asked)
    for name, wanted in (("hidden_states", hidden), ("attentions", attentions)):
        if wanted:
            assert len(out[name]) == len(plain[name])
            for got, expected in zip(out[name], plain[name]):
                torch.testing.assert_close(got, expected, atol=0, rtol=0)
        else:
            assert out.get(name) is None


@pytest.mark.parametrize("package", ["colossalai", "megatron.bridge"])
def test_another_frameworks_hook_is_kept_once_its_package_is_named(package, monkeypatch):
    """A framework outside the built-in list (its hook only places the weight): refused, naming the call that keeps
    it; kept once named, for its submodules only; the log-probs are the model's."""
    from grpo_kernels.integrations import head_hooks, trust_head_hooks

    monkeypatch.setattr(head_hooks, "_trusted_by_user", [])
    model = tiny_causal_lm("qwen2")

    def hook(module, args):
        return None
    hook.__module__ = f"{package}.sharding"
    model.lm_head.register_forward_pre_hook(hook)
    with pytest.raises(TypeError, match=rf"trust_head_hooks\('{package.split('.')[0]}'\)"):
        patch_causal_lm(model, backend="torch")
    trust_head_hooks(f"{package}x")  # another package whose name starts alike keeps nothing
    with pytest.raises(TypeError, match="has a forward pre-hook"):
        patch_causal_lm(model, backend="torch")
    trust_head_hooks(package)
    patch_causal_lm(model, backend="torch")
    input_ids, labels = labelled_batch(seed=2)
    out = model(input_ids, labels=labels, return_logprobs=True)
    torch.testing.assert_close(out.logps, logits_path_logps(model, input_ids, labels), atol=LOGP_ATOL, rtol=0)
    for bad in ("", "two words", 3, "a..b"):
        with pytest.raises(ValueError, match="^trust_head_hooks: expected a package's dotted name"):
            trust_head_hooks(bad)
