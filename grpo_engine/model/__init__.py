"""The model: loading (Hugging Face, LoRA, the hidden-state policy), FSDP2 sharding, tensor parallelism."""
