"""The float32 logits workspace's default size: read by the backends that stream through one (uses_workspace),
the kept-token chunking, the custom ops, routing and validation, so it lives below all of them."""

# What a backend that streams through a workspace gets when the caller gives no `workspace_bytes` and the cost
# model does not size it (routing.py); also the bound of a kept-token chunk's logits.
DEFAULT_WORKSPACE_BYTES = 1 << 30
