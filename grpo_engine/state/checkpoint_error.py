"""The error of an unreadable or mismatched checkpoint: its own module, so the code that writes and reads the
FSDP shards (grpo_engine/model/fsdp.py), which grpo_engine/state/checkpoint.py calls, can raise it without importing that
module back."""


class CheckpointError(RuntimeError):
    pass
