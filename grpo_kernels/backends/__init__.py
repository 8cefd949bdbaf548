"""The backends: one module per way of streaming the LM head's logits, and the wrappers around any of them."""
