"""patch_causal_lm's switches and labels: a switch given anything but True or False is refused by one line naming it
(bool("False") is True: lm_head_fp32="False" cast the head to float32, return_entropy="no" returned entropies), and a
refusal of the labels names `labels`, the argument the caller wrote, not the log-probs' internal `targets`."""

from __future__ import annotations

import pytest
import torch
from integration_models import VOCAB_SIZE, tiny_causal_lm

from grpo_kernels.integrations.transformers import patch_causal_lm

NOT_BOOLS = ["False", "no", 0, 1, None, torch.tensor(True), [True]]


@pytest.fixture(scope="module")
def model():
    return patch_causal_lm(tiny_causal_lm("llama"), backend="reference")


def _inputs():
    input_ids = torch.randint(3, VOCAB_SIZE, (2, 6), generator=torch.Generator().manual_seed(0))
    return input_ids, input_ids.clone()


@pytest.mark.parametrize("value", NOT_BOOLS)
def test_lm_head_fp32_must_be_a_bool(model, value):
    with pytest.raises(TypeError, match="^lm_head_fp32 must be True or False, got "):
        patch_causal_lm(model, backend="reference", lm_head_fp32=value)  # patching again: the settings only


@pytest.mark.parametrize("switch", ["return_logprobs", "return_entropy"])
@pytest.mark.parametrize("value", [v for v in NOT_BOOLS if v is not None])
def test_forward_switches_must_be_bools(model, switch, value):
    input_ids, labels = _inputs()
    given = {"return_logprobs": True, switch: value}
    with pytest.raises(TypeError, match=f"^{switch} must be True or False, got "):
        model(input_ids, labels=labels, **given)


@pytest.mark.parametrize("bad", ["float", "past_vocab", "negative"])
def test_a_refusal_of_the_labels_names_labels(model, bad):
    input_ids, labels = _inputs()
    labels = {"float": labels.float(), "past_vocab": labels.masked_fill(labels == labels[0, 3], VOCAB_SIZE + 5),
              "negative": labels.masked_fill(labels == labels[0, 3], -7)}[bad]
    with pytest.raises((TypeError, ValueError)) as caught:
        model(input_ids, labels=labels, return_logprobs=True)
    assert str(caught.value).startswith("labels must ") and "\n" not in str(caught.value), str(caught.value)
