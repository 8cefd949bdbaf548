"""A loaded model's attention, checked causal: each position's hidden state depends on the tokens before it only.

GRPO scores each completion token by the tokens before it, as it was sampled. A model whose attention also looks
ahead trains on log-probs of another distribution than the one that sampled, with no error anywhere: a BERT-family
model saved as a masked LM (transformers builds it as `BertLMHeadModel` without `is_decoder`, and only logs a
hint), a config with `use_bidirectional_attention` true, a model whose code builds a prefix-LM or full mask. No
config key tells them all apart, so the loaded model is asked: one forward of two short sequences that differ in
their last token only, whose first position must come out the same.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .limits import embedding_rows

# The first position of a causal model sees one token, the same in both sequences, through the same operations on
# the same values: its hidden states come out equal, bit for bit (masked positions weigh exactly 0), in every dtype.
# One that attends ahead moved them by 0.2% of their size and more (a randomly initialised BERT, float32 to float16).
RELATIVE_TOLERANCE = 1e-4
PROBE_LENGTH = 6


def attends_ahead(decoder: nn.Module, vocab_rows: int, device: torch.device) -> Optional[float]:
    """The relative change of the first position's hidden state between two sequences that share their first token
    only, when above rounding; None for a causal `decoder` (a transformers decoder stack, called as the training
    forward calls it)."""
    if vocab_rows < 2:
        return None
    positions = torch.arange(PROBE_LENGTH, device=device)
    first = positions % vocab_rows
    second = torch.cat([first[:1], (vocab_rows - 1 - positions[1:]) % vocab_rows])
    states = []
    with torch.no_grad():
        for ids in (first, second):  # one sequence at a time: no other sequence of a batch can touch it
            out = decoder(input_ids=ids[None], attention_mask=torch.ones_like(ids)[None], position_ids=positions[None],
                          use_cache=False)
            states.append(out.last_hidden_state[0, 0].float())
    scale = float(states[0].abs().max()) or 1.0
    change = float((states[0] - states[1]).abs().max()) / scale
    return change if change > RELATIVE_TOLERANCE else None


def check_causal_attention(lm: nn.Module, path: str, error: type[Exception]) -> None:
    """`error`, naming the model directory, when the causal LM `lm` (in eval mode) attends ahead."""
    decoder = lm.get_decoder()
    if decoder is None:  # nothing to call as the training forward calls it: its own failure says so
        return
    device = lm.get_input_embeddings().weight.device
    change = attends_ahead(decoder, embedding_rows(lm), device)
    if change is not None:
        # the configurations of encoder families (BERT, RoBERTa, ...) that can also be built as decoders carry the key
        hint = (" (its config.json has is_decoder false: an encoder's masked LM; a decoder of its family is saved "
                "with is_decoder true)" if getattr(lm.config, "is_decoder", None) is False else "")
        raise error(f"the model at {path!r} does not attend causally: its first position's hidden state changes "
                    f"(by {change:.2g} of its size) with a later token, so training would score each token by text "
                    f"after it; the engine trains causal (decoder-only) language models{hint}")
