"""The rollout step: every process draws the step's prompts and generates its share of their completions.

With rollout.max_staleness k >= 1 (a server backend) the batches of the next k steps are generated while this
one trains: one background thread sends them, in order, to the servers. The weights are pushed only once every
generation in flight has finished (`drain`), so each batch comes from one known policy version, at most k
optimizer rounds old. A batch that is older, or of unknown version (a server that failed and may have restarted
with its starting weights), is dropped, counted, and generated again after a fresh push.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import torch

from ..rollout.base import RolloutBatch
from ..rollout.http_client import ServerUnavailable
from ..run_setup import Run

MAX_REGENERATIONS = 3


def draw_prompts(run: Run) -> tuple[list[dict[str, Any]], list[str]]:
    """Every process draws the same prompts; each takes its contiguous share of the G-fold repeats."""
    cfg, acc = run.config, run.accelerator
    indices = run.sampler.next_indices(cfg.prompts_per_step(acc.num_processes))
    repeated = [i for i in indices for _ in range(cfg.rollout.num_generations)]
    n_local = cfg.generation_batch_size()
    local = repeated[acc.process_index * n_local: (acc.process_index + 1) * n_local]
    return [run.rows[i] for i in local], [run.prompts[i] for i in local]


def rollout(run: Run) -> tuple[list[dict[str, Any]], RolloutBatch]:
    """This step's rows and completions, generated now (on-policy)."""
    rows, prompts = draw_prompts(run)
    return rows, run.rollout_backend.generate(prompts, record_kept=run.config.rollout.replays_kept_tokens())


class RolloutPipeline:
    """The batches of the coming steps, generated up to rollout.max_staleness steps ahead."""

    def __init__(self, run: Run) -> None:
        self.ahead = run.config.rollout.max_staleness
        self.pending: deque[tuple[list[dict[str, Any]], Future]] = deque()
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="rollout-ahead") if self.ahead else None
        self.dropped = 0  # samples dropped as too old or of unknown version, over every process

    def next(self, run: Run, trainer_version: int) -> tuple[list[dict[str, Any]], RolloutBatch]:
        """This step's rows and batch, none of its samples older than the bound. Raises ServerUnavailable on every
        process when a server stopped answering on any."""
        for _ in range(MAX_REGENERATIONS + self.ahead):
            failure, result = None, None
            try:
                result = self._take(run)
            except ServerUnavailable as exc:
                failure = exc
            too_old = 0 if result is None else self._too_old(result[1], trainer_version)
            flags = torch.tensor([float(failure is not None), float(too_old)], device=run.device)
            if run.accelerator.num_processes > 1:
                flags = run.accelerator.reduce(flags, reduction="sum")
            if flags[0] > 0:
                self.close()
                raise failure or ServerUnavailable("(another process's server)", 0.0, "see that process's error")
            if flags[1] == 0:
                return result
            self.dropped += int(flags[1])
            self.drain()
            if getattr(run.rollout_backend, "version", trainer_version) != trainer_version:
                run.rollout_backend.sync_weights(trainer_version)  # a server that lost its weights gets them again
        raise RuntimeError(f"no batch within rollout.max_staleness ({self.ahead}) after {MAX_REGENERATIONS} "
                           f"regenerations: the servers keep failing or losing their weights")

    def _take(self, run: Run) -> tuple[list[dict[str, Any]], RolloutBatch]:
        if self.worker is None:
            return rollout(run)
        while len(self.pending) < self.ahead + 1:
            rows, prompts = draw_prompts(run)
            seeds = run.rollout_backend.draw_seeds(len(prompts))  # on this thread: the run's RNG stream
            self.pending.append((rows, self.worker.submit(run.rollout_backend.generate, prompts, seeds=seeds)))
        rows, future = self.pending.popleft()
        return rows, future.result()

    def _too_old(self, batch: RolloutBatch, trainer_version: int) -> int:
        """The batch's samples of unknown version or more than max_staleness rounds behind the trainer."""
        versions = batch.policy_version
        return 0 if versions is None else int(((versions < 0) | (trainer_version - versions > self.ahead)).sum())

    def drain(self) -> None:
        """Waits for every generation in flight (before a push: no batch straddles two weight versions)."""
        wait([future for _, future in self.pending])

    def close(self) -> None:
        if self.worker is not None:
            for _, future in self.pending:
                future.cancel()
            self.pending.clear()
            self.worker.shutdown(wait=True, cancel_futures=True)
