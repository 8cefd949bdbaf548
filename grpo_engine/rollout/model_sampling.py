"""The sampling a model directory's generation_config.json recommends, which the engine does not apply: said once.

The rollout settings alone decide the sampling (hf.py sampling_by_the_rollout_settings; the loss scores the
distribution they define), so a model shipped with `temperature 0.6, top_k 20` samples at rollout.temperature and
rollout.top_k. That is by design, but it was silent: a user who expected the model's own values trained and
evaluated at others without a word.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from ..config import RolloutConfig

# generation_config.json's keys that change the sampling distribution: the rollout setting that decides it instead
# (None: the engine has no such setting), and the value that changes nothing.
SAMPLING_KEYS: dict[str, tuple[Optional[str], Any]] = {
    "temperature": ("temperature", 1.0), "top_p": ("top_p", 1.0), "top_k": ("top_k", 0),
    "repetition_penalty": ("repetition_penalty", 1.0), "min_p": (None, 0.0), "typical_p": (None, 1.0),
    "epsilon_cutoff": (None, 0.0), "eta_cutoff": (None, 0.0), "no_repeat_ngram_size": (None, 0),
}


def unapplied_model_sampling(model_dir: str | Path, rollout: RolloutConfig) -> Optional[str]:
    """One line naming the sampling values of `model_dir`'s generation_config.json that differ from what the
    rollout samples with, or None (no file, a greedy one, or nothing that differs). The file's types and ranges are
    checked before (model/model_files.py); one that cannot be read here is left to that check."""
    path = Path(model_dir) / "generation_config.json"
    try:
        values = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, ValueError):
        return None
    if not isinstance(values, dict) or values.get("do_sample") is False:  # the model recommends greedy decoding
        return None
    differing = []
    for key, (setting, neutral) in SAMPLING_KEYS.items():
        value = values.get(key)
        if value is None or isinstance(value, bool):
            continue
        in_force = neutral if setting is None else getattr(rollout, setting)
        if value != in_force:
            differing.append((key, value, setting, in_force))
    if not differing:
        return None
    recommended = ", ".join(f"{key} {value}" for key, value, _, _ in differing)
    settings = [f"rollout.{setting} {in_force}" for _, _, setting, in_force in differing if setting]
    unmatched = [key for key, _, setting, _ in differing if not setting]
    applied = "; ".join(filter(None, [", ".join(settings),
                                      f"no rollout setting for {', '.join(unmatched)}" if unmatched else ""]))
    advice = "" if not settings else (f"; set {', '.join(part.rsplit(' ', 1)[0] for part in settings)} to sample "
                                      f"as the model recommends")
    return (f"{path} recommends {recommended}, which the engine does not apply: the rollout settings decide the "
            f"sampling ({applied}){advice}")
