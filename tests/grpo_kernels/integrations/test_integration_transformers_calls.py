"""A patched model's head modes given arguments a careless user writes, and LM heads the kernels cannot reproduce:
every one refused by one line naming what is wrong, before the backbone runs, or computed right.

Before: labels given positionally were reported missing (and the sixth positional argument reached the backbone as
its `use_cache`); unbatched input_ids failed inside attention; a non-callable lm_head_fn failed as "'str' object is
not callable" after the whole backbone; logits_to_keep was silently ignored; a head whose own forward is not
weight @ h + bias (an nn.Linear subclass with its own forward, a quantized or custom module) gave log-probs of
logits the model never computes; a head that does not fit the hidden size was called "sharded"; a head never loaded
(meta) failed as "Tensor.item() cannot be called on meta tensors"; shifted_label_logprobs given a [T, H] state failed as an IndexError.
The other batch inputs (input_ids past the embedding, inputs_embeds of another width, an attention_mask or
position_ids of another shape, meta tensors) failed inside the backbone or the head, or were silently not applied.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from integration_models import VOCAB_SIZE, logits_path_logps, tiny_causal_lm
from torch import nn
from transformers import LlamaForCausalLM

from grpo_kernels.integrations.transformers import patch_causal_lm, run_head, shifted_label_logprobs

LOGP_ATOL = 2e-5
HIDDEN = 32


@pytest.fixture(scope="module")
def model():
    model = patch_causal_lm(tiny_causal_lm("llama"), backend="torch")
    model.backbone_calls = []
    model.model.register_forward_pre_hook(lambda *_: model.backbone_calls.append(1))
    return model


def _batch(seed: int = 0):
    input_ids = torch.randint(3, VOCAB_SIZE, (2, 7), generator=torch.Generator().manual_seed(seed))
    labels = input_ids.clone()
    labels[:, :3] = -100
    return input_ids, labels


# LlamaForCausalLM.forward's leading parameters, in its order (the fourth is past_key_values or, from transformers
# 5.2x, cache)
POSITIONAL = tuple(inspect.signature(LlamaForCausalLM.forward).parameters)[1:7]


@settings(max_examples=12, deadline=None)
@given(positional=st.integers(0, len(POSITIONAL)), seed=st.integers(0, 3))
def test_any_split_between_positional_and_keyword_arguments_gives_the_same_logprobs(model, positional, seed):
    input_ids, labels = _batch(seed)
    values = dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=labels)
    assert POSITIONAL[-1] == "labels"
    args = [values.get(name) for name in POSITIONAL[:positional]]
    kwargs = {name: values[name] for name in POSITIONAL[positional:] if name in values}
    with torch.no_grad():
        out = model(*args, return_logprobs=True, **kwargs)
    torch.testing.assert_close(out.logps, logits_path_logps(model, input_ids, labels), atol=LOGP_ATOL, rtol=0)


def _bad_call(kind: str, value):
    """(keyword arguments of a head-mode call, the argument the refusal must name)."""
    input_ids, labels = _batch()
    if kind == "lm_head_fn":
        return dict(input_ids=input_ids, lm_head_fn=value), "lm_head_fn"
    if kind == "logits_to_keep":
        return dict(input_ids=input_ids, labels=labels, return_logprobs=True, logits_to_keep=value), "logits_to_keep"
    if kind == "unbatched":
        return dict(input_ids=input_ids[0], labels=labels[0], return_logprobs=True), "input_ids"
    if kind == "labels_rank":
        return dict(input_ids=input_ids, labels=labels.reshape(-1)[: value], return_logprobs=True), "labels"
    if kind == "empty":
        return dict(input_ids=input_ids[:0], labels=labels[:0], return_logprobs=True), "input_ids"
    if kind == "fn_arguments":  # a head fn that cannot take (last_hidden_state, weight, bias)
        return dict(input_ids=input_ids, lm_head_fn=value), "lm_head_fn"
    if kind == "ignored_by_lm_head_fn":
        return dict(input_ids=input_ids, lm_head_fn=lambda h, w, b: h.sum(),
                    **{value: 0.5 if value == "temperature" else True}), value
    raise AssertionError(kind)


BAD_CALLS = st.one_of(
    st.tuples(st.just("lm_head_fn"), st.one_of(st.text(max_size=5), st.integers(), st.just(torch.zeros(2)))),
    st.tuples(st.just("logits_to_keep"), st.integers(1, 10)),
    st.tuples(st.just("unbatched"), st.none()),
    st.tuples(st.just("labels_rank"), st.integers(1, 14)),
    st.tuples(st.just("empty"), st.none()),
    st.tuples(st.just("fn_arguments"), st.sampled_from([lambda h: h, lambda h, w: h, lambda h, w, b, targets: h])),
    st.tuples(st.just("ignored_by_lm_head_fn"), st.sampled_from(["temperature", "return_entropy"])),
)


def _refused_before_the_backbone(model, kwargs: dict, name: str) -> None:
    """The head-mode call refused by one line starting with `name`, the backbone never run."""
    model.backbone_calls.clear()
    with pytest.raises((TypeError, ValueError)) as caught:
        model(**kwargs)
    message = str(caught.value)
    assert message.startswith(name) and "\n" not in message, message
    assert model.backbone_calls == []


@settings(max_examples=30, deadline=None)
@given(bad=BAD_CALLS)
def test_a_bad_head_mode_call_is_refused_by_one_line_before_the_backbone(model, bad):
    kwargs, name = _bad_call(*bad)
    _refused_before_the_backbone(model, kwargs, name)


def _faulty_batch_input(mode: str, given: str, fault: tuple) -> tuple[dict, str]:
    """(keyword arguments of a head-mode call with one batch input at fault, the argument the refusal must name)."""
    input_ids, labels = _batch()
    batch, length = input_ids.shape
    name, kind, size = fault
    kwargs = dict(attention_mask=torch.ones_like(input_ids), position_ids=torch.arange(length)[None])
    if given == "inputs_embeds":
        kwargs["inputs_embeds"] = torch.randn(batch, length, HIDDEN)
    else:
        kwargs["input_ids"] = input_ids
    kwargs.update(dict(labels=labels, return_logprobs=True) if mode == "return_logprobs"
                  else dict(lm_head_fn=lambda h, w, b: h.sum()))
    if kind == "meta":
        name = given if name == "inputs" else name
        kwargs[name] = (kwargs[name] if name in kwargs else labels).to("meta")
    elif kind == "length":  # a mask or positions of another batch's length
        kwargs[name] = torch.ones(batch, length + size, dtype=torch.long) if name == "attention_mask" else \
            torch.arange(length + size)[None]
    elif kind == "rows":  # of another batch size (positions may be shared: one row)
        kwargs[name] = torch.ones(batch + size, length, dtype=torch.long) if name == "attention_mask" else \
            torch.arange(length).repeat(batch + size, 1)
    elif kind == "id":  # a token id past the embedding or below 0 (another tokenizer's, a -100 label)
        name = given
        if given == "inputs_embeds":  # the same fault for embeddings: another model's width
            width = 1 + abs(size) % (2 * HIDDEN)
            kwargs[name] = torch.randn(batch, length, width + (width == HIDDEN))
        else:
            kwargs[name] = input_ids.clone().index_fill_(1, torch.tensor([size % length]), VOCAB_SIZE + size
                                                         if size >= 0 else size)
    return kwargs, name


BATCH_INPUT_FAULTS = st.one_of(
    st.tuples(st.sampled_from(["attention_mask", "position_ids"]), st.just("length"),
              st.integers(-6, 6).filter(bool)),
    st.tuples(st.sampled_from(["attention_mask", "position_ids"]), st.just("rows"), st.integers(1, 4)),
    st.tuples(st.just("inputs"), st.just("id"), st.integers(-200, 1000)),
    st.tuples(st.sampled_from(["inputs", "attention_mask", "position_ids", "labels"]), st.just("meta"), st.none()),
)


@settings(max_examples=40, deadline=None)
@given(mode=st.sampled_from(["return_logprobs", "lm_head_fn"]), given_as=st.sampled_from(["input_ids", "inputs_embeds"]),
       fault=BATCH_INPUT_FAULTS)
def test_a_batch_input_that_does_not_fit_the_batch_or_the_model_is_refused_naming_it_before_the_backbone(
        model, mode, given_as, fault):
    # Before: ids past the embedding failed as an IndexError naming nothing, another width or positions' length
    # inside the backbone, meta labels inside the head, and a mask of another shape was silently not applied
    kwargs, name = _faulty_batch_input(mode, given_as, fault)
    if fault[0] == "labels" and mode != "return_logprobs":
        return  # lm_head_fn takes no labels
    _refused_before_the_backbone(model, kwargs, name)


@pytest.mark.parametrize("positions", ["none", "one row", "every row"])
def test_the_batch_inputs_transformers_takes_give_the_plain_logprobs(model, positions):
    input_ids, labels = _batch()
    batch, length = input_ids.shape
    given = {"none": {}, "one row": dict(position_ids=torch.arange(length)[None]),
             "every row": dict(position_ids=torch.arange(length).repeat(batch, 1))}[positions]
    with torch.no_grad():
        out = model(input_ids, attention_mask=torch.ones_like(input_ids), labels=labels, return_logprobs=True, **given)
        four_d = model(input_ids, attention_mask=torch.zeros(batch, 1, length, length), labels=labels,
                       lm_head_fn=lambda h, w, b: h.sum())  # a 4-D mask of transformers' own form is its business
    torch.testing.assert_close(out.logps, logits_path_logps(model, input_ids, labels), atol=LOGP_ATOL, rtol=0)
    assert torch.isfinite(four_d.head_output)


def test_positional_arguments_the_forward_cannot_bind_are_refused_by_name(model):
    input_ids, labels = _batch()
    with pytest.raises(TypeError, match=r"^LlamaForCausalLM.forward takes at most \d+ positional arguments \(input_ids, "):
        model(input_ids, *[None] * 40, labels=labels, return_logprobs=True)
    with pytest.raises(TypeError, match=r"^LlamaForCausalLM.forward got labels both positionally and by keyword"):
        model(input_ids, None, None, None, None, labels, labels=labels, return_logprobs=True)


class _Scaled(nn.Linear):
    def forward(self, hidden):  # a head with its own forward: its logits are not weight @ h
        return 0.5 * super().forward(hidden)


class _Int8Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", torch.ones(VOCAB_SIZE, HIDDEN, dtype=torch.int8))
        self.bias = None

    def forward(self, hidden):
        return hidden @ self.weight.float().T


class _Int8Linear(nn.Linear):  # nn.Linear's own forward, but a quantized weight
    def __init__(self) -> None:
        super().__init__(HIDDEN, VOCAB_SIZE, bias=False)
        self.weight = nn.Parameter(torch.ones(VOCAB_SIZE, HIDDEN, dtype=torch.int8), requires_grad=False)


FOREIGN_HEADS = {"linear subclass with its own forward": lambda: _Scaled(HIDDEN, VOCAB_SIZE),
                 "custom module": _Int8Head, "int8 weight": _Int8Linear, "identity": nn.Identity}


@pytest.mark.parametrize("when", ["at patch time", "replaced after patching"])
@pytest.mark.parametrize("head", sorted(FOREIGN_HEADS))
def test_a_head_whose_output_is_not_weight_times_hidden_is_refused(head, when):
    model = tiny_causal_lm("llama")
    if when == "at patch time":
        model.lm_head = FOREIGN_HEADS[head]()
        call = lambda: patch_causal_lm(model)  # noqa: E731
    else:
        patch_causal_lm(model)
        model.lm_head = FOREIGN_HEADS[head]()
        input_ids, labels = _batch()
        call = lambda: model(input_ids, labels=labels, return_logprobs=True)  # noqa: E731
    with pytest.raises(TypeError) as caught:
        call()
    message = str(caught.value)
    assert ("LM head" in message or "lm_head" in message) and "\n" not in message, message


class _PlainSubclass(nn.Linear):
    """nn.Linear's own forward: its output is weight @ h + bias."""


@pytest.mark.parametrize("head_class", [nn.Linear, _PlainSubclass])
def test_a_linear_head_with_a_bias_is_computed(head_class):
    model = tiny_causal_lm("llama")
    model.lm_head = head_class(HIDDEN, VOCAB_SIZE, bias=True)
    nn.init.normal_(model.lm_head.bias, std=2.0)
    input_ids, labels = _batch()
    expected = logits_path_logps(model, input_ids, labels)
    with torch.no_grad():
        out = patch_causal_lm(model, backend="torch")(input_ids, labels=labels, return_logprobs=True)
    torch.testing.assert_close(out.logps, expected, atol=LOGP_ATOL, rtol=0)


def test_a_head_that_does_not_fit_the_hidden_size_is_not_called_sharded():
    model = patch_causal_lm(tiny_causal_lm("llama"))
    model.lm_head = nn.Linear(HIDDEN // 2, VOCAB_SIZE, bias=False)
    input_ids, labels = _batch()
    with pytest.raises(ValueError, match=r"^lm_head takes 16 input features, but the model's last_hidden_state has 32"):
        model(input_ids, labels=labels, return_logprobs=True)


def test_a_head_never_loaded_is_refused_by_name():
    with torch.device("meta"):
        model = patch_causal_lm(tiny_causal_lm("llama"))
    input_ids, labels = _batch()
    with pytest.raises(ValueError, match=r"^lm_head.weight is on the meta device"):
        model(input_ids.to("meta"), labels=labels.to("meta"), return_logprobs=True)


@pytest.mark.parametrize("hidden", [torch.zeros(7, HIDDEN), torch.zeros(2, 7, HIDDEN).numpy(), [[0.0] * HIDDEN]])
def test_shifted_label_logprobs_refuses_a_hidden_state_not_b_t_h(model, hidden):
    _, labels = _batch()
    with pytest.raises(ValueError, match=r"^last_hidden_state must be a \[B, T, H\] tensor, got "):
        shifted_label_logprobs(model, hidden, labels[0] if getattr(hidden, "ndim", 3) == 2 else labels, 1.0, False)


@pytest.mark.parametrize("fn", [None, "fused", 3])
def test_run_head_refuses_a_fn_that_is_not_callable(model, fn):
    with pytest.raises(TypeError, match=r"^fn must be a callable fn\(last_hidden_state, weight, bias\), got "):
        run_head(model, torch.zeros(1, 3, HIDDEN), fn)
