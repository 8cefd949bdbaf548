"""What a model's config says about it before its weights load."""

from transformers import Qwen3Config

from grpo_engine.data.demo_task import build_char_tokenizer, tiny_model_config
from grpo_engine.model.limits import attention_head_size


def test_attention_head_size_reads_the_config():
    assert attention_head_size(tiny_model_config(build_char_tokenizer())) == 16  # 64 wide over 4 heads
    # An explicit head_dim wins over hidden_size / num_attention_heads (Qwen3: 128-wide heads at any width).
    assert attention_head_size(Qwen3Config(hidden_size=64, num_attention_heads=2, head_dim=128)) == 128
