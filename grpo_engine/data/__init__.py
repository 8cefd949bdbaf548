"""Prompts and their data files, the built-in demo task and its supervised warm start."""
