"""The values of config.json the supported model families (Llama, Qwen2, Qwen3, Mistral, Gemma, Granite) read,
typed and bounded before any weight loads: each refusal is one line naming the key and what it should be.

transformers checks few of them, and some not at all: `max_position_embeddings` 0 or negative, `rms_norm_eps`
negative or 1e308 (every output the same: the norm divides by the epsilon), `attention_dropout` outside [0, 1),
`initializer_range` negative and `torch_dtype` "bogus" all loaded silently; a zero, negative or non-dividing head
count or size failed deep in the model's construction ("ZeroDivisionError", "negative dimension", "You set
`ignore_mismatched_sizes` to `False`"); a `rope_theta` <= 0 was reported as NaN weights of a diverged run; an unknown
`hidden_act` as a KeyError. Keys not declared here (models carry many) are left to transformers.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, StrictBool, StrictInt, model_validator

# a JSON number, whole or not ("1e-6" or true refused), within float32's range: the model computes with it in float32
# or narrower (an initializer_range of 1e308 drew infinite weights)
FLOAT32_MAX = 3.4028234663852886e38
Number = Annotated[float, Strict(), Field(allow_inf_nan=False, ge=-FLOAT32_MAX, le=FLOAT32_MAX)]
Size = Annotated[StrictInt, Field(ge=1)]
Positive = Annotated[Number, Field(gt=0)]
Probability = Annotated[Number, Field(ge=0, lt=1)]


def _activation(name: str) -> str:
    from transformers.activations import ACT2FN

    if name not in ACT2FN:
        raise ValueError("the name of an activation transformers knows (silu, gelu, gelu_pytorch_tanh, relu, ...)")
    return name


def _dtype(name: Optional[str]) -> Optional[str]:
    import torch

    if name is not None and name != "auto" and not isinstance(getattr(torch, name, None), torch.dtype):
        raise ValueError("a torch dtype's name (float32, bfloat16, float16), auto or null")
    return name


def _rope_type(name: str) -> str:
    # transformers validates only the kinds it knows: an unknown one loaded its config with a warning per read and
    # failed when the model was built ("KeyError: 'bogus'")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    known = ["default", *sorted(ROPE_INIT_FUNCTIONS)]
    if name not in known:
        raise ValueError(f"a rotary embedding kind transformers knows ({', '.join(known)})")
    return name


Activation = Annotated[str, AfterValidator(_activation)]
RopeType = Annotated[str, AfterValidator(_rope_type)]
DtypeName = Annotated[Optional[str], AfterValidator(_dtype)]


class RopeSettings(BaseModel):
    """rope_parameters (transformers >= 5) / rope_scaling: the rotary embedding's base and scaling."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    rope_theta: Optional[Positive] = None
    rope_type: Optional[RopeType] = None
    type: Optional[RopeType] = None  # rope_scaling's older name for rope_type
    factor: Optional[Positive] = None
    partial_rotary_factor: Optional[Annotated[Number, Field(gt=0, le=1)]] = None


class ModelConfigValues(BaseModel):
    """config.json (or its text_config) as the decoder reads it: sizes >= 1, positive epsilons and bases, dropouts
    in [0, 1), booleans true / false (not "false"), and the head counts and sizes consistent with each other."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    vocab_size: Optional[Size] = None
    hidden_size: Optional[Size] = None
    intermediate_size: Optional[Size] = None
    num_hidden_layers: Optional[Size] = None
    num_attention_heads: Optional[Size] = None
    num_key_value_heads: Optional[Size] = None
    head_dim: Optional[Size] = None
    max_position_embeddings: Optional[Size] = None
    sliding_window: Optional[Size] = None
    max_window_layers: Optional[Annotated[StrictInt, Field(ge=0)]] = None
    # a small positive number: the RMS norm divides by sqrt(mean square + eps), so an eps near 1 or above flattens
    # every hidden state (1e308: every output the same); the families in use take 1e-5 or 1e-6
    rms_norm_eps: Optional[Annotated[Number, Field(gt=0, lt=1)]] = None
    layer_norm_eps: Optional[Annotated[Number, Field(gt=0, lt=1)]] = None
    attention_dropout: Optional[Probability] = None
    hidden_dropout: Optional[Probability] = None
    rope_theta: Optional[Positive] = None
    rope_parameters: Optional[RopeSettings] = None  # or one per layer type (Gemma 3): see config_values_problem
    rope_scaling: Optional[RopeSettings] = None
    initializer_range: Optional[Annotated[Number, Field(ge=0)]] = None
    hidden_act: Optional[Activation] = None
    hidden_activation: Optional[Activation] = None  # Gemma's
    tie_word_embeddings: Optional[StrictBool] = None
    use_cache: Optional[StrictBool] = None
    attention_bias: Optional[StrictBool] = None
    mlp_bias: Optional[StrictBool] = None
    use_sliding_window: Optional[StrictBool] = None
    dtype: DtypeName = None
    torch_dtype: DtypeName = None
    # Granite's multipliers and Gemma's scalings: positive factors
    embedding_multiplier: Optional[Positive] = None
    residual_multiplier: Optional[Positive] = None
    attention_multiplier: Optional[Positive] = None
    logits_scaling: Optional[Positive] = None
    query_pre_attn_scalar: Optional[Positive] = None
    final_logit_softcapping: Optional[Positive] = None
    attn_logit_softcapping: Optional[Positive] = None

    @model_validator(mode="after")
    def _heads_consistent(self) -> "ModelConfigValues":
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        if heads and kv_heads and heads % kv_heads:
            raise ValueError(f"num_key_value_heads: a divisor of num_attention_heads ({heads}), got {kv_heads} "
                             f"(each key/value head serves a whole group of attention heads)")
        if heads and self.hidden_size and self.head_dim is None and self.hidden_size % heads:
            raise ValueError(f"hidden_size: a multiple of num_attention_heads ({heads}) when there is no head_dim, "
                             f"got {self.hidden_size}")
        rotary = self.rope_theta is not None or self.rope_parameters is not None or self.rope_scaling is not None
        head = self.head_dim or (self.hidden_size // heads if heads and self.hidden_size else None)
        if rotary and head is not None and head % 2:
            keys = "head_dim" if self.head_dim else "hidden_size / num_attention_heads (no head_dim)"
            shown = head if self.head_dim else f"{self.hidden_size} / {heads} = {head}"
            raise ValueError(f"{keys}: an even head size (rotary embeddings turn pairs of dimensions), got {shown}")
        return self


def config_values_problem(values: dict[str, Any], where: str = "") -> Optional[str]:
    """What is wrong with config.json's `values` (its text_config's too): "key: ...", or None."""
    from .generation_file import settings_problem

    rope = values.get("rope_parameters")
    if isinstance(rope, dict) and rope and all(isinstance(part, dict) for part in rope.values()):  # per layer type
        for layer, part in rope.items():
            problem = settings_problem(part, RopeSettings, None)
            if problem:
                return f"{where}rope_parameters.{layer}.{problem}"
        values = {**values, "rope_parameters": None}
    problem = settings_problem(values, ModelConfigValues, None)
    if problem is None and isinstance(values.get("text_config"), dict):
        return config_values_problem(values["text_config"], f"{where}text_config.")
    return None if problem is None else where + problem


# A layer kind of `layer_types` -> the setting of the built configuration its attention reads the window from.
LAYER_WINDOWS = {"sliding_attention": "sliding_window", "chunked_attention": "attention_chunk_size"}


def layer_kinds_problem(config: Any) -> Optional[str]:
    """What keeps the configuration transformers built (`config`, after its own defaults and rules: Qwen2 drops
    `sliding_window` unless `use_sliding_window` is true) from running each layer its `layer_types` names, or None: a
    windowed layer with no window ("sliding_attention" with sliding_window null failed at the first forward, deep in
    transformers' cache, "TypeError: 'NoneType' object cannot be interpreted as an integer")."""
    for part in (config, getattr(config, "text_config", None)):
        kinds = getattr(part, "layer_types", None) or []
        for layer, kind in enumerate(kinds):
            setting = LAYER_WINDOWS.get(kind)
            window = getattr(part, setting, None) if setting else 1
            if not (isinstance(window, int) and not isinstance(window, bool) and window >= 1):
                hint = (" (qwen2 keeps sliding_window only with use_sliding_window true)"
                        if getattr(part, "use_sliding_window", None) is False else "")
                return (f"layer_types: layer {layer} is {kind!r}, which needs {setting} (a whole number >= 1), but "
                        f"the configuration has {window!r}{hint}; set it, or make the layer 'full_attention'")
    return None
