"""Rollout backends: what a backend returns (base.py) and the Hugging Face `generate` backend (hf.py, with the
sampler record of sampler_record.py)."""
