"""The rollout step: every process draws the step's prompts and generates its share of their completions."""

from __future__ import annotations

from typing import Any

from ..rollout.base import RolloutBatch
from ..run_setup import Run


def rollout(run: Run) -> tuple[list[dict[str, Any]], RolloutBatch]:
    """Every process draws the same prompts; each generates its contiguous share of the G-fold repeats."""
    cfg, acc = run.config, run.accelerator
    indices = run.sampler.next_indices(cfg.prompts_per_step(acc.num_processes))
    repeated = [i for i in indices for _ in range(cfg.rollout.num_generations)]
    n_local = cfg.generation_batch_size()
    local = repeated[acc.process_index * n_local: (acc.process_index + 1) * n_local]
    batch = run.rollout_backend.generate([run.prompts[i] for i in local], record_kept=cfg.rollout.replays_kept_tokens())
    return [run.rows[i] for i in local], batch
