"""A vLLM server's answer to one completion request, read against what the request asked.

The backend asks for one completion (n 1) of at most `max_tokens` tokens, as token ids (`token_id:N`) with the
sampled tokens' log-probs. An answer that parses but breaks that was trained on before, without a word: a token id
past the run's vocabulary (a server serving another model) reached the embedding as an IndexError, or decoded to
other text; a NaN, positive or missing (null, read as 0) log-prob became the sampler's probability in the
importance ratio; more tokens than asked made the completion longer than rollout.max_new_tokens; log-probs fewer
than the tokens left zeros, more were a tensor size error; a second choice was dropped silently. Each is now one
line naming the server, the field and what was asked (ServerAnswerError), before the batch is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from .http_client import ServerAnswerError, ServerClient

REQUEST = "POST /v1/completions"
TOKEN_PREFIX = "token_id:"
# A log-prob is at most 0; float rounding of a sure token's log-softmax may give a hair above it.
LOGPROB_SLACK = 1e-4
ANOTHER_MODEL = "does it serve another model than model.name_or_path?"


@dataclass(frozen=True)
class CompletionAsk:
    """What every completion request of the backend asks for."""

    max_tokens: int
    vocab_size: int  # token ids are in [0, vocab_size): the rows the run samples from
    sampled: bool  # whether the log-probs are read (a greedy batch's are not)


def read_completion(client: ServerClient, answer: Any, ask: CompletionAsk) -> tuple[list[int], Optional[list[float]]]:
    """(token ids, log-probs or None when not sampled) of the one completion `answer` holds, checked against `ask`."""
    choices = client.read_field(answer, REQUEST, "choices", kind=list)
    if len(choices) != 1:
        raise client.answer_error(REQUEST, ("choices",), f"with {len(choices)} choices for the 1 asked (n 1) at",
                                  choices)
    where = ("choices", 0, "logprobs")
    tokens = client.read_field(answer, REQUEST, *where, "tokens", kind=list)
    if not 1 <= len(tokens) <= ask.max_tokens:
        raise client.answer_error(REQUEST, where + ("tokens",), f"with {len(tokens)} tokens for 1 to max_tokens "
                                  f"{ask.max_tokens} (rollout.max_new_tokens) at", tokens)
    ids = [_token_id(client, token, where + ("tokens", i), ask.vocab_size) for i, token in enumerate(tokens)]
    logprobs = client.read_field(answer, REQUEST, *where, "token_logprobs", kind=list)
    if len(logprobs) != len(tokens):
        raise client.answer_error(REQUEST, where + ("token_logprobs",), f"with {len(logprobs)} log-probs for its "
                                  f"{len(tokens)} tokens at", logprobs)
    if not ask.sampled:
        return ids, None
    for i, value in enumerate(logprobs):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and value <= LOGPROB_SLACK):
            raise client.answer_error(REQUEST, where + ("token_logprobs", i),
                                      "with a log-prob that is not a finite number <= 0 at", value)
    return ids, [min(float(v), 0.0) for v in logprobs]


def _token_id(client: ServerClient, token: Any, keys: tuple, vocab_size: int) -> int:
    """A token of `return_tokens_as_token_ids` ('token_id:123'), within the run's vocabulary."""
    value = token[len(TOKEN_PREFIX):] if isinstance(token, str) and token.startswith(TOKEN_PREFIX) else ""
    if not (value.isascii() and value.isdigit()):
        raise client.answer_error(REQUEST, keys, "with a token that is not token_id:N (return_tokens_as_token_ids) at",
                                  token)
    if len(value) > 12 or int(value) >= vocab_size:  # 12 digits: no int() of a megabyte of them
        raise client.answer_error(REQUEST, keys, f"with a token id past the run's {vocab_size}-token vocabulary at",
                                  token, hint=ANOTHER_MODEL)
    return int(value)
