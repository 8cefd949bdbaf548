"""The training loop's steps."""
