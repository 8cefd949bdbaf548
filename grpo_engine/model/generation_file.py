"""The values of generation_config.json (and the token ids of config.json) a model directory holds, typed before
anything loads: the engine reads the EOS ids from them (rollout/base.py eos_ids) and transformers' generate merges
the rest into every call.

transformers checks few of them: `"eos_token_id": "a"` failed in a tensor constructor ("too many dimensions 'str'"),
`"top_k": "x"` with a traceback inside generate, and an EOS id past the vocabulary was taken silently (no completion
could end: every one ran to rollout.max_new_tokens). Keys not declared here are left to transformers.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, ValidationError

TokenId = Annotated[StrictInt, Field(ge=0)]
TokenIds = Optional[Union[TokenId, Annotated[list[TokenId], Field(min_length=1)]]]
Number = Union[StrictInt, StrictFloat]  # JSON writes 1.0 as 1: a whole number is a number here too
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


class TokenIdSettings(BaseModel):
    """The special token ids, of config.json (its text part) and generation_config.json alike."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    bos_token_id: TokenIds = None
    eos_token_id: TokenIds = None
    pad_token_id: TokenIds = None
    decoder_start_token_id: TokenIds = None


class GenerationSettings(TokenIdSettings):
    """generation_config.json: the sampling settings generate reads, each of its type and range."""

    do_sample: Optional[StrictBool] = None
    use_cache: Optional[StrictBool] = None
    # the ranges transformers' GenerationConfig takes (0 where a greedy config writes it), not the engine's own
    temperature: Optional[Annotated[Number, Field(ge=0)]] = None
    top_k: Optional[Annotated[StrictInt, Field(ge=0)]] = None
    top_p: Optional[Annotated[Number, Field(ge=0, le=1)]] = None
    min_p: Optional[Annotated[Number, Field(ge=0, le=1)]] = None
    typical_p: Optional[Annotated[Number, Field(ge=0, le=1)]] = None
    repetition_penalty: Optional[Annotated[Number, Field(gt=0)]] = None
    length_penalty: Optional[Number] = None
    max_length: Optional[Annotated[StrictInt, Field(ge=1)]] = None
    max_new_tokens: Optional[Annotated[StrictInt, Field(ge=1)]] = None
    min_length: Optional[Annotated[StrictInt, Field(ge=0)]] = None
    min_new_tokens: Optional[Annotated[StrictInt, Field(ge=0)]] = None
    num_beams: Optional[Annotated[StrictInt, Field(ge=1)]] = None
    num_return_sequences: Optional[Annotated[StrictInt, Field(ge=1)]] = None
    no_repeat_ngram_size: Optional[Annotated[StrictInt, Field(ge=0)]] = None


class TokenizerSettings(TokenIdSettings):
    """tokenizer_config.json's values the tokenizer compares or branches on when it loads or encodes. transformers
    checks only the two sides (in its words, after the model directory's other checks); `"model_max_length": "x"`
    failed with a TypeError traceback at the first prompt, and -1, 0, 1.5 or true warned "longer than the specified
    maximum sequence length" at every prompt (the engine bounds prompts by data.max_prompt_length itself)."""

    model_max_length: Optional[Annotated[Number, Field(ge=1)]] = None
    padding_side: Literal["left", "right"] = "right"  # null too: transformers refuses it
    truncation_side: Literal["left", "right"] = "right"


def vocab_size_of(config: dict) -> Optional[int]:
    """config.json's vocabulary (its text part's, for a multimodal model), when it declares one."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    size = text.get("vocab_size", config.get("vocab_size"))
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


BRANCH_NAMES = {"int", "float", "str", "bool", "list", "dict", "none"}  # pydantic's names of a union's branches


def _first_problem(exc: ValidationError) -> str:
    """'key: what it should be, got value' of the first error (a list's position as key[i], a nested setting's key
    as key.inner; pydantic's names of a union's branches left out); a check of several keys says its keys itself."""
    error = exc.errors()[0]
    message = error["msg"].removeprefix("Value error, ")
    if not error["loc"]:
        return message[:300]
    key = str(error["loc"][0]) + "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"][1:]
        if isinstance(part, int) or part.isidentifier() and part[0].islower() and part not in BRANCH_NAMES)
    got = "" if error["type"] == "missing" else f", got {error['input']!r}"  # a missing key's input: the whole file
    return f"{key}: {message[0].lower() + message[1:]}{got}"[:300]


def settings_problem(values: dict, schema: type[BaseModel], vocab_size: Optional[int]) -> Optional[str]:
    """What is wrong with `values` by `schema`, with each token id below `vocab_size` when known: "key: ..."."""
    try:
        settings = schema.model_validate(values)
    except ValidationError as exc:
        return _first_problem(exc)
    if vocab_size is None:
        return None
    for key in TOKEN_ID_KEYS:
        value: Any = getattr(settings, key)
        ids = value if isinstance(value, list) else [] if value is None else [value]
        outside = next((token for token in ids if token >= vocab_size), None)
        if outside is not None:
            return (f"{key}: token ids below config.json's vocab_size {vocab_size}, got {value!r} (no such token"
                    f"{': no completion could stop at it' if key == 'eos_token_id' else ''})")
    return None
