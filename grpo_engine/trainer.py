"""The GRPO loop: rollout, reward, advantage, log-probs, update, log, checkpoint; one function each."""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from tqdm.auto import tqdm

from .config import EngineConfig
from .config.loading import config_as_loaded
from .host_state import off_main_thread_note, run_process_state
from .data.prompts import reward_columns
from .model.finite_forward import NonFiniteForwardError
from .model.fsdp import reshard
from .model.loading import base_causal_lm, hf_progress_bars_off
from .rollout.base import RolloutBatch
from .lost_process import lost_processes_named
from .run_setup import Run, data_source_name, setup_run
from .state import checkpoint as ckpt
from .rollout.http_client import ServerUnavailable
from .state.file_size_limit import check_file_size_limit, largest_checkpoint_file
from .state.interrupt import RolloutServerLost, StopRequest, TrainingInterrupted, stop_at_step_boundary
from .state.metrics import StepTimer, completion_metrics, merge_metrics, peak_memory_mb, read_metrics
from .state.plot import plot_run
from .state.run_and_data import check_apart_from_data, inputs_of
from .state.run_lock import RunDirectoryMoved, RunLock, hold_run_directory
from .steps.advantages import group_advantages, per_function_metrics
from .steps.logprobs import reference_logprobs, sequence_logprobs
from .steps.packing import Packing, attention_pair_cost, has_varlen_attention
from .steps.rewards import score_completions
from .steps.off_policy import importance_weights, staleness_metrics
from .steps.rollout import RolloutPipeline
from .steps.update import UpdateInputs, num_items_per_process, policy_update
from .tools.evaluate import evaluate_prompts

_log = logging.getLogger(__name__)  # grpo_engine/messages.py: how the CLI shows it


@dataclass
class TrainSummary:
    run_dir: str
    steps: int
    rewards: list[float]  # the mean reward of every step logged in the run directory
    eval_before: Optional[dict[str, float]]
    eval_after: Optional[dict[str, float]]


def train(config: EngineConfig) -> TrainSummary:
    """Train with `config`, checked again as load_config checks it (a config set or built after load may break a
    rule), under the process state every host gets (host_state.py), the caller's put back afterwards."""
    config = config_as_loaded(config)
    note = off_main_thread_note(config)
    if note:
        _log.warning(note)
    with run_process_state():
        return _train(config)


def _train(config: EngineConfig) -> TrainSummary:
    # transformers' loading / saving bars would break up the training bar; the run directory is this run's alone;
    # the process group (torchrun, accelerate launch) ends with the run, however it ends, and a process lost mid-run
    # is named by the others
    check_apart_from_data(config.run.output_dir, inputs_of(config.data.path, config.data.eval_path,
                                                           config.model.name_or_path))  # before it is made
    with process_group_destroyed_at_exit(), \
            lost_processes_named(config.run.distributed_timeout_s, config.run.output_dir), hf_progress_bars_off(), \
            hold_run_directory(config.run.output_dir) as lock:
        run = setup_run(config)
        cfg = run.config
        check_file_size_limit(largest_checkpoint_file(run.lm), "the model's checkpoint files")  # before step 1
        eval_before = evaluate(run) if run.start_step == 0 else None
        check_run_directory_in_place(run, lock, run.start_step)
        log_eval(run, 0, eval_before)  # the accuracy before training, kept in metrics.jsonl as step 0
        bar = tqdm(total=cfg.run.max_steps, initial=run.start_step, desc="grpo", disable=not (
            cfg.run.progress_bar and run.accelerator.is_main_process))
        pipeline = RolloutPipeline(run)
        completed = run.start_step  # the optimizer rounds whose weights the policy holds
        with stop_at_step_boundary(cfg.run.save_on_interrupt) as stop:
            try:
                for step in range(run.start_step + 1, cfg.run.max_steps + 1):
                    timer = StepTimer()
                    with timer.phase("generate"):
                        rows, batch = pipeline.next(run, step - 1)
                    with timer.phase("score"):
                        advantages, rewards, reward_metrics = score(run, rows, batch)
                    with timer.phase("logprobs"):
                        old_logps, ref_logps, ratio, off_policy = logprobs(run, batch)
                    with timer.phase("update"):
                        update_metrics = update(run, batch, advantages, old_logps, ref_logps, step, ratio)
                    completed = step
                    with timer.phase("push"):
                        pipeline.drain()  # no generation in flight straddles the new weights
                        run.rollout_backend.sync_weights(step)  # the next rollout samples from the updated policy
                    metrics = merge_metrics(reward_metrics, update_metrics, off_policy,
                                            staleness_metrics(batch.policy_version, step - 1),
                                            {"staleness/dropped_samples": pipeline.dropped},
                                            step_metrics(run, batch, timer))
                    check_run_directory_in_place(run, lock, step)  # before the step's first write there
                    log(run, step, metrics, batch, rewards, bar)
                    if cfg.run.eval_steps and step % cfg.run.eval_steps == 0 and step != cfg.run.max_steps:
                        log_eval(run, step, evaluate(run))
                    saved = save(run, step) if step == cfg.run.max_steps or (
                        cfg.run.save_steps and step % cfg.run.save_steps == 0) else None
                    if step < cfg.run.max_steps and stop.requested(run.world):
                        pipeline.close()
                        stop_training(run, stop, step, saved, bar)
            except NonFiniteForwardError as exc:  # raised where the step is not known
                pipeline.close()
                raise exc.at_step(step) from None
            except ServerUnavailable as exc:
                pipeline.close()
                bar.close()
                checkpoint = save(run, completed)
                run.logger.close()
                raise RolloutServerLost(str(exc), completed, checkpoint) from None
        pipeline.close()
        bar.close()
        result = finish(run, eval_before, evaluate(run))
        if lock is not None and not lock.in_place():  # the summary names the directory: it must hold the run
            raise lock.moved(cfg.run.max_steps)
        return result


@contextmanager
def process_group_destroyed_at_exit() -> Iterator[None]:
    """Destroy the default process group when the run ends (returns or raises), on every process: left to the
    interpreter's teardown, gloo's threads can abort a rank (SIGABRT) after the run succeeded, and torch warns of a
    group never destroyed. A process group the caller made before train() is the caller's to destroy, and so is one
    made in a single process (no launcher's WORLD_SIZE > 1): the colocated vLLM engine makes its own and destroys
    it at its own shutdown, which fails on a group already destroyed."""
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    owned = launched and not (torch.distributed.is_available() and torch.distributed.is_initialized())
    try:
        yield
    finally:
        if owned and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def check_run_directory_in_place(run: Run, lock: Optional[RunLock], step: int) -> None:
    """RunDirectoryMoved on every process when the run directory was deleted, moved or replaced (RunLock.in_place,
    seen by the main process, which holds it): all stop at the same step, none waits for another in a collective."""
    moved = lock is not None and not lock.in_place()
    if run.accelerator.num_processes > 1:
        flag = torch.tensor([1.0 if moved else 0.0], device=run.device)
        moved = run.accelerator.reduce(flag, reduction="sum").item() > 0
    if moved:
        raise lock.moved(step) if lock is not None else RunDirectoryMoved(
            f"the run directory was deleted, moved or replaced while the run trained (seen by the main process): "
            f"stopped after step {step}")


def save(run: Run, step: int) -> Path:
    return ckpt.save_checkpoint(run.accelerator, run.run_dir, step, run.lm, run.tokenizer, run.optimizer,
                                run.scheduler, run.trainer_state(), run.config.run.save_total_limit,
                                config_yaml=run.config_yaml)


def stop_training(run: Run, stop: StopRequest, step: int, saved: Optional[Path], bar) -> None:
    """A stop signal at a step boundary: save (unless this step was just saved), close the sinks, raise."""
    checkpoint = saved or save(run, step)
    bar.close()  # ends the bar's line, so the hint that follows stands on its own
    run.logger.close()
    raise TrainingInterrupted(stop.signal_name or "a stop signal on another process", step, checkpoint)


def score(run: Run, rows: list[dict[str, Any]], batch: RolloutBatch
          ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Local rewards, gathered so advantages see whole groups and the whole batch.

    Returns this process's advantages and weighted rewards, and the batch's reward metrics.
    """
    cfg, acc = run.config, run.accelerator
    source = data_source_name(cfg.data.path)
    local = score_completions(run.rewards, batch.prompts, batch.completions,
                              reward_columns(rows, cfg.data.prompt_column), batch.token_ids_lists(),
                              [f"{source} row {run.row_positions.get(id(row), '?')}" for row in rows])
    rewards = acc.gather(local.to(run.device)).cpu()
    weights = torch.tensor([r.weight for r in run.rewards])
    result = group_advantages(rewards, weights, cfg.rollout.num_generations, cfg.rewards.scale_rewards)
    share = slice(acc.process_index * len(batch.prompts), (acc.process_index + 1) * len(batch.prompts))
    metrics = {**result.metrics, **per_function_metrics(rewards, [r.name for r in run.rewards])}
    return result.advantages[share].to(run.device), result.total_rewards[share], metrics


def logprobs(run: Run, batch: RolloutBatch) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor],
                                                    Optional[torch.Tensor], dict[str, float]]:
    """(old log-probs, reference log-probs, importance weights, off-policy metrics). The old log-probs are computed
    when the batch is reused (returned) or the off-policy correction needs them (its weights: the policy before this
    round over the sampler); the reference log-probs only when beta != 0."""
    cfg = run.config
    args = (batch, cfg.rollout.temperature, cfg.optim.per_device_train_batch_size, cfg.run.loss_backend)
    packing = packing_of(run)
    mode = cfg.rollout.importance_sampling_mode()
    correct = mode is not None and batch.sampler_logps is not None
    old = sequence_logprobs(run.unwrapped_policy, *args, packing=packing) \
        if cfg.optim.num_iterations > 1 or correct else None
    ref = reference_logprobs(run.unwrapped_policy, run.reference, *args, packing=packing) \
        if cfg.loss.beta != 0.0 else None
    if run.fsdp and run.reference is not None:
        reshard(run.reference)  # no backward will free its gathered embedding and head
    ratio, metrics = None, {}
    if correct:
        ratio, metrics = importance_weights(old, batch.sampler_logps, batch.completion_mask, mode,
                                            cfg.rollout.importance_sampling_cap)
        metrics = gather_mean(run, metrics)
    return (old if cfg.optim.num_iterations > 1 else None), ref, ratio, metrics


def packing_of(run: Run) -> Optional[Packing]:
    """The padding-free step's packing, or None for the padded step."""
    optim = run.config.optim
    if not optim.padding_free:
        return None
    lm = base_causal_lm(run.lm)
    return Packing(optim.max_tokens_per_micro_batch, has_varlen_attention(lm), attention_pair_cost(lm.config))


def update(run: Run, batch: RolloutBatch, advantages: torch.Tensor, old_logps: Optional[torch.Tensor],
           ref_logps: Optional[torch.Tensor], step: int, importance_ratio: Optional[torch.Tensor] = None
           ) -> dict[str, float]:
    """The optimizer steps of this round; loss metrics averaged over processes, and the LR they used."""
    cfg = run.config
    lr = run.scheduler.get_last_lr()[0]
    inputs = UpdateInputs(batch, advantages, old_logps, ref_logps,
                          num_items_per_process(run.accelerator, batch.completion_mask), importance_ratio)
    metrics = policy_update(run.accelerator, run.policy, run.lm, run.optimizer, run.scheduler, inputs, cfg.loss_config(),
                            cfg.optim.per_device_train_batch_size, cfg.optim.num_iterations,
                            cfg.optim.max_grad_norm, cfg.run.loss_backend, step, packing=packing_of(run))
    return {**gather_mean(run, metrics), "learning_rate": lr}


def gather_mean(run: Run, metrics: dict[str, float]) -> dict[str, float]:
    """Average per-process scalars over processes (sorted names: the same order on every process)."""
    names = sorted(metrics)
    values = torch.tensor([metrics[n] for n in names], dtype=torch.float64, device=run.device)
    values = run.accelerator.reduce(values, reduction="mean")
    return dict(zip(names, values.tolist()))


def step_metrics(run: Run, batch: RolloutBatch, timer: StepTimer) -> dict[str, float]:
    acc = run.accelerator
    lengths = acc.gather(batch.completion_attention.sum(dim=1)).cpu()
    truncated = acc.gather(batch.truncated).cpu()
    tokens = acc.gather(batch.attention_mask.sum().reshape(1)).sum().item()
    run.num_tokens += int(tokens)  # TRL's num_tokens: prompt + completion tokens seen so far, all processes
    timing = timer.metrics()
    return {"num_tokens": run.num_tokens, **completion_metrics(lengths, truncated), **timing,
            "step_time": timing["time/step"], "tokens/s": tokens / timing["time/step"],
            "memory/peak_mb": peak_memory_mb(run.device),
            "epoch": run.sampler.epoch + run.sampler.offset / run.sampler.num_rows}


def log(run: Run, step: int, metrics: dict[str, float], batch: RolloutBatch, rewards: torch.Tensor, bar) -> None:
    run.logger.log(step, metrics)
    bar.set_postfix(reward=f"{metrics['reward']:.3f}", loss=f"{metrics['loss']:.4f}", refresh=False)
    bar.update(1)
    loss_tokens = num_items_per_process(run.accelerator, batch.completion_mask) * run.accelerator.num_processes
    # on every process: a stop it calls for must stop them all
    messages = run.health.check(step, metrics, loss_tokens=loss_tokens, last=step == run.config.run.max_steps)
    if run.accelerator.is_main_process:
        for message in messages:
            tqdm.write(f"warning: {message}", file=sys.stderr)
    every = run.config.run.log_completions_steps
    if every and step % every == 0:
        group = run.config.rollout.num_generations
        shown = rewards[:group].tolist()
        run.logger.log_samples(step, batch.prompts[:group], batch.completions[:group], shown)
        if run.accelerator.is_main_process and run.config.run.progress_bar:
            tqdm.write(f"step {step}: {batch.prompts[0]!r} -> {batch.completions[0]!r} (reward {shown[0]:.2f})")


def log_eval(run: Run, step: int, result: Optional[dict[str, float]]) -> None:
    if result is not None:
        run.logger.log(step, {f"eval_{name}": value for name, value in result.items()})  # the Trainer's prefix


def evaluate(run: Run) -> Optional[dict[str, float]]:
    """Accuracy on the evaluation prompts (main process), greedy or sampled per run.eval_num_samples.

    Sampling runs on a forked, fixed-seed RNG: evaluations are comparable, and the training RNG stream
    (hence exact resume) is untouched.
    """
    if not run.eval_rows:
        return None
    result = None
    samples = run.config.run.eval_num_samples
    # A TP or FSDP model runs only with every rank
    if run.accelerator.is_main_process or run.tensor_parallel or run.fsdp:
        with torch.random.fork_rng(devices=[run.device] if run.device.type == "cuda" else []):
            torch.manual_seed(run.config.run.seed)
            result = evaluate_prompts(run.rollout_backend, run.eval_rows, run.eval_prompts, run.rewards,
                                      num_samples=samples, greedy=samples == 1,
                                      prompt_column=run.config.data.prompt_column,
                                      source=data_source_name(run.config.data.eval_path))
    run.accelerator.wait_for_everyone()
    return result if run.accelerator.is_main_process else None


def finish(run: Run, eval_before: Optional[dict], eval_after: Optional[dict]) -> TrainSummary:
    summary = TrainSummary(str(run.run_dir), run.config.run.max_steps, [], eval_before, eval_after)
    if run.accelerator.is_main_process:
        log_eval(run, run.config.run.max_steps, eval_after)
        run.logger.close()
        summary.rewards = [row["reward"] for row in read_metrics(run.run_dir) if "reward" in row]
        if run.config.run.plot:
            try:
                plot_run(run.run_dir)
            except ImportError as exc:  # the run itself succeeded; the picture is optional
                _log.warning(f"no curves.png: {exc}")
    run.accelerator.wait_for_everyone()
    return summary
