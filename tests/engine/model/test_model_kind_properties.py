"""Models of a kind the engine cannot train as given, each refused in one line naming the file or setting: a
config.json rotary embedding kind transformers does not know (was "KeyError: 'bogus'" at the load), a model_type
with no causal-LM class (was transformers' list of ~200 classes, cut off, after the run directory was written), a
loaded model that attends ahead (a BERT masked LM trained silently on log-probs of text after each token),
model.lora.target_modules naming no module, a layer LoRA cannot adapt, or the LM head (peft's words after the load;
the head's adapters never trained), and a LoRA adapter directory as train's starting model. A target preflight
takes passes the checks made of the adapted model (LoRA on embed_tokens failed them with an AttributeError), and
the attention is checked for FSDP's whole model on the CPU too."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_engine.config import load_config
from grpo_engine.model.causal_attention import check_causal_attention
from grpo_engine.model.loading import ModelLoadError, check_model_dir
from grpo_engine.preflight import PreflightError, preflight
from model_variants import check_taken_or_refused

DERANDOMIZE = bool(os.environ.get("CI"))
FAST = settings(max_examples=15, deadline=None, derandomize=DERANDOMIZE,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _known_rope_kinds() -> list[str]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return ["default", *ROPE_INIT_FUNCTIONS]


@FAST
@given(kind=st.sampled_from(_known_rope_kinds()) | st.text(max_size=12), key=st.sampled_from(["rope_type", "type"]),
       where=st.sampled_from(["rope_scaling", "rope_parameters"]))
def test_a_rope_kind_is_one_transformers_knows_or_refused_naming_config_json(kind, key, where, tiny_model_dir,
                                                                            tmp_path_factory):
    directory = tmp_path_factory.mktemp("rope")
    shutil.copytree(tiny_model_dir, directory, dirs_exist_ok=True)
    config = json.loads((directory / "config.json").read_text())
    config[where] = {key: kind, "factor": 2.0, "rope_theta": 10000.0}
    (directory / "config.json").write_text(json.dumps(config))
    # a known kind may still be refused by transformers' own rule for it (yarn's keys), in words naming config.json
    check_taken_or_refused(directory, "config.json", where if kind not in _known_rope_kinds() else "",
                           kind, kind in _known_rope_kinds())


def _types_without_causal_lm() -> list[str]:
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    causal = {config.model_type for config in AutoModelForCausalLM._model_mapping.keys()}
    return sorted(set(CONFIG_MAPPING_NAMES) - causal)


@settings(max_examples=15, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(model_type=st.sampled_from(_types_without_causal_lm()))
def test_a_model_type_without_a_causal_lm_class_is_refused_before_any_weight_loads(model_type, tiny_model_dir,
                                                                                  tmp_path_factory):
    directory = tmp_path_factory.mktemp("kind")
    shutil.copytree(tiny_model_dir, directory, dirs_exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": model_type}))
    with pytest.raises(ModelLoadError) as refused:
        check_model_dir(str(directory))
    message = str(refused.value)
    assert "\n" not in message and "config.json" in message, message


def _decoder_only(kind: str, seed: int) -> tuple[torch.nn.Module, bool]:
    """A tiny model of `kind` and whether it attends causally."""
    from transformers import (BertConfig, BertLMHeadModel, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                              RobertaConfig, RobertaForCausalLM)

    torch.manual_seed(seed)
    sizes = dict(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=32)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**sizes)), True
    if kind == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2, n_positions=32)), True
    family = {"bert": (BertConfig, BertLMHeadModel), "roberta": (RobertaConfig, RobertaForCausalLM)}
    config_class, model_class = family[kind.split("-")[0]]
    decoder = kind.endswith("decoder")  # saved as a decoder (causal), or as the encoder's masked LM
    return model_class(config_class(**sizes, is_decoder=decoder, pad_token_id=1)), decoder


@FAST
@given(kind=st.sampled_from(["llama", "gpt2", "bert-decoder", "bert-encoder", "roberta-decoder", "roberta-encoder"]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), seed=st.integers(0, 2**16))
def test_a_model_that_attends_ahead_is_refused_and_a_causal_one_taken(kind, dtype, seed):
    model, causal = _decoder_only(kind, seed)
    model = model.to(dtype).eval()
    if causal:
        check_causal_attention(model, "m", ModelLoadError)
        return
    with pytest.raises(ModelLoadError, match="does not attend causally") as refused:
        check_causal_attention(model, "m", ModelLoadError)
    assert "\n" not in str(refused.value)


@settings(max_examples=8, deadline=None, derandomize=DERANDOMIZE,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kind=st.sampled_from(["llama", "bert-decoder", "bert-encoder", "roberta-encoder"]), fsdp=st.booleans())
def test_the_load_checks_the_attention_for_fsdp_too(kind, fsdp, tmp_path_factory):
    """The loader asks whether the model attends causally whether it moves the model to the device or keeps it on
    the CPU for FSDP to shard (it returned before asking: a masked LM trained under model.fsdp)."""
    from grpo_engine.config.schema import ModelConfig
    from grpo_engine.model.loading import load_causal_lm

    model, causal = _decoder_only(kind, 0)
    directory = tmp_path_factory.mktemp("model")
    model.save_pretrained(directory)
    config = ModelConfig(dtype="float32")
    if causal:
        load_causal_lm(str(directory), config, torch.device("cpu"), keep_on_cpu=fsdp)
        return
    with pytest.raises(ModelLoadError, match="does not attend causally"):
        load_causal_lm(str(directory), config, torch.device("cpu"), keep_on_cpu=fsdp)


def test_eval_of_a_masked_lm_is_its_one_line_without_what_building_it_logs(tiny_model_dir, tmp_path):
    """The checks before the load build the model on the meta device; what building it logs (BERT's "add
    `is_decoder=True`", three times) came before the refusal's one line."""
    import subprocess
    import sys

    from transformers import BertConfig, BertForMaskedLM

    BertForMaskedLM(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64)).save_pretrained(tmp_path)  # the tiny tokenizer's 99 tokens
    for tokenizer_file in tiny_model_dir.glob("*token*"):
        shutil.copy(tokenizer_file, tmp_path)
    result = subprocess.run([sys.executable, "-m", "grpo_engine", "eval", "--model", str(tmp_path)],
                            capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert result.returncode == 1 and "does not attend causally" in result.stderr, result.stderr[-2000:]
    assert "is_decoder=True" not in result.stderr, result.stderr[-2000:]


def _module_targets() -> st.SearchStrategy[str]:
    # the tiny Qwen2's adaptable layers, its other modules, the LM head, and names of nothing
    return st.sampled_from(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                            "embed_tokens", "self_attn.q_proj", "layers.0.mlp.up_proj", "lm_head", "norm",
                            "input_layernorm", "mlp", "self_attn", "rotary_emb", "act_fn"]) | st.text(
        "abcdefghijklmnopqrstuvwxyz_.0", min_size=1, max_size=10)


def _peft_trains(model_dir, targets: list[str]) -> bool:
    """peft adapts a module for each name (it takes a list of which only one name matches: a misspelt one is left out
    silently), and none is the LM head (whose adapters the fused loss never reads)."""
    import peft
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model_dir)
    try:
        adapted = peft.get_peft_model(lm, peft.LoraConfig(r=2, target_modules=targets, task_type="CAUSAL_LM"))
    except Exception:
        return False
    lora = [name for name, module in adapted.named_modules() if hasattr(module, "lora_A")]
    each = all(any(name.endswith("." + target) for name in lora) for target in targets)
    return each and not hasattr(adapted.get_base_model().get_output_embeddings(), "lora_A")


@FAST
@given(targets=st.lists(_module_targets(), min_size=1, max_size=3, unique=True))
def test_lora_target_modules_are_checked_before_any_weight_loads_as_peft_matches_them(targets, tiny_model_dir,
                                                                                     tmp_path):
    config = load_config(overrides={"model.lora.enabled": True, "model.lora.target_modules": targets,
                                    "rollout.max_new_tokens": 8, "run.output_dir": str(tmp_path / "run")})
    try:
        preflight(config, [{"prompt": "1+1=", "answer": "2"}], [], str(tiny_model_dir))
    except PreflightError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("model.lora.target_modules: "), exc
        assert not _peft_trains(tiny_model_dir, targets), f"refused {targets}: {exc}"
        return
    assert _peft_trains(tiny_model_dir, targets), f"took {targets}"
    _checks_after_lora(tiny_model_dir, config)


def _checks_after_lora(model_dir, config) -> None:
    """The checks a run makes of the adapted model answer for every target preflight takes: with embed_tokens
    adapted the input embedding is peft's wrapper, which has no num_embeddings (an AttributeError once the run
    directory was written)."""
    from transformers import AutoModelForCausalLM

    from grpo_engine.model.limits import check_tokenizer_fits
    from grpo_engine.model.loading import add_lora, load_tokenizer

    adapted = add_lora(AutoModelForCausalLM.from_pretrained(model_dir), config.model.lora)
    check_causal_attention(adapted.eval(), str(model_dir), ModelLoadError)
    check_tokenizer_fits(load_tokenizer(str(model_dir)), adapted, str(model_dir))


def test_lora_on_the_embeddings_passes_the_checks_after_it(tiny_model_dir, tmp_path):
    config = load_config(overrides={"model.lora.enabled": True, "model.lora.target_modules": ["embed_tokens"],
                                    "run.output_dir": str(tmp_path / "run")})
    _checks_after_lora(tiny_model_dir, config)


def test_a_lora_adapter_directory_is_not_trains_starting_model(tiny_model_dir, tmp_path, capsys):
    import peft
    from transformers import AutoModelForCausalLM

    from grpo_engine.cli import main

    lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    adapters = tmp_path / "adapters"
    peft.get_peft_model(lm, peft.LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM")).save_pretrained(
        adapters)
    shutil.copy(tiny_model_dir / "tokenizer.json", adapters)
    shutil.copy(tiny_model_dir / "tokenizer_config.json", adapters)
    assert main(["train", "--model", str(adapters), "--output-dir", str(tmp_path / "run"),
                 "--data.builtin_max_operand", "2"]) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "holds LoRA adapters (adapter_config.json), not a whole model" in error, error
    assert not (tmp_path / "run").exists()
