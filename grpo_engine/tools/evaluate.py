"""Accuracy and pass@k of a model on a prompt set, scored by the same reward functions as training.

A completion counts as solved when the first reward function gives it a positive score (math_accuracy:
+1 correct vs -1 / -0.5). pass@k uses the unbiased estimator of Chen et al. (2021) over n >= k samples.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Optional

import torch

from ..config import DataConfig, EngineConfig, is_hub_id
from ..data.demo_task import addition_problems
from ..data.prompts import load_prompt_rows, render_prompts, reward_columns
from ..hub import resolve_model
from ..model.adapter_fit import adapter_fit_problem
from ..model.limits import check_lengths_fit, check_prompts_fit, check_tokenizer_fits
from ..model.loading import ModelLoadError, check_model_dir, load_causal_lm, load_tokenizer, resolve_device
from ..preflight import (check_tokenizer_vocabulary, check_top_k_within_vocabulary, model_config_of, model_positions,
                         prompt_lengths)
from ..rollout import HFRollout, RolloutBackend
from ..rollout.model_sampling import unapplied_model_sampling
from ..state.checkpoint import MANIFEST_FILE, checkpoint_of_model, manifest_problems
from ..steps.rewards import NamedReward, check_reward_columns, load_reward_functions, score_completions

_log = logging.getLogger(__name__)  # grpo_engine/messages.py: how the CLI shows it


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n (c correct) is correct."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(judged: list[int], solved: list[int], k: int) -> float:
    """pass@k over the prompts with at least k completions the first reward judged (scored, not None / NaN); NaN
    when none has. Accuracy and pass@k count only judged completions: before, one the first reward did not score
    (a row without an answer) counted as unsolved, and data without answers read as accuracy 0.0, not null."""
    counted = [pass_at_k(n, c, k) for n, c in zip(judged, solved) if n >= k]
    return sum(counted) / len(counted) if counted else math.nan


def evaluate_prompts(backend: RolloutBackend, rows: list[dict[str, Any]], prompts: list[str],
                     rewards: list[NamedReward], num_samples: int = 1, greedy: bool = True, batch_size: int = 64,
                     prompt_column: str = "prompt", source: str = "the evaluation data") -> dict[str, float]:
    """Generates `num_samples` completions per prompt (one when greedy) with the rollout backend and aggregates
    the rewards; a reward's bad value names the row of `source` (how messages name the rows) it scored. A completion
    is solved when the first reward scores it above 0; accuracy and pass@k are over the ones it scored."""
    if greedy and num_samples != 1:
        raise ValueError("greedy decoding gives one distinct completion per prompt: use num_samples=1 or sampling")
    per_prompt = max(1, batch_size // num_samples)
    solved_counts, judged_counts, reward_sums, lengths = [], [], torch.zeros(len(rewards)), []
    scored_counts = torch.zeros(len(rewards))
    for start in range(0, len(rows), per_prompt):
        chunk_rows = rows[start: start + per_prompt]
        repeated = [p for p in prompts[start: start + per_prompt] for _ in range(num_samples)]
        completions, token_ids = generate_at_most(backend, repeated, greedy, batch_size)
        columns = {k: [v for v in values for _ in range(num_samples)]
                   for k, values in reward_columns(chunk_rows, prompt_column).items()}
        sources = [f"{source} row {start + k // num_samples}" for k in range(len(repeated))]
        table = score_completions(rewards, repeated, completions, columns, token_ids, sources)
        first = table[:, 0].view(len(chunk_rows), num_samples)
        solved_counts.extend((first > 0).sum(dim=1).tolist())
        judged_counts.extend((~torch.isnan(first)).sum(dim=1).tolist())
        reward_sums += torch.nan_to_num(table, nan=0.0).sum(dim=0)
        scored_counts += (~torch.isnan(table)).sum(dim=0)
        lengths.extend(len(ids) for ids in token_ids)
    judged = sum(judged_counts)
    metrics = {"accuracy": sum(solved_counts) / judged if judged else math.nan, "num_prompts": float(len(rows)),
               "completions/mean_length": sum(lengths) / len(lengths)}
    k = 1
    while k <= num_samples:
        metrics[f"pass@{k}"] = mean_pass_at_k(judged_counts, solved_counts, k)
        k *= 2
    if f"pass@{num_samples}" not in metrics:  # k = n is always reported
        metrics[f"pass@{num_samples}"] = mean_pass_at_k(judged_counts, solved_counts, num_samples)
    for j, reward in enumerate(rewards):  # NaN (null) for a function that scored nothing, as training logs it
        scored = scored_counts[j].item()
        metrics[f"rewards/{reward.name}/mean"] = (reward_sums[j] / scored).item() if scored else math.nan
    return metrics


def generate_at_most(backend: RolloutBackend, prompts: list[str], greedy: bool,
                     batch_size: int) -> tuple[list[str], list[list[int]]]:
    """(completion texts, completion token ids) of `prompts`, generated `batch_size` at a time: one prompt's
    samples are split too. Before, --num-samples past --batch-size generated every sample of a prompt at once
    (--num-samples 1000 on a real model: a batch of 1000, out of memory)."""
    completions: list[str] = []
    token_ids: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        batch = backend.generate(prompts[start: start + batch_size], greedy=greedy)
        completions.extend(batch.completions)
        token_ids.extend(batch.token_ids_lists())
    return completions, token_ids


def load_eval_model(path: str, config: EngineConfig, device: torch.device) -> tuple[torch.nn.Module, Any]:
    """A model directory or Hub id, or a LoRA adapter directory (its base, a directory or a Hub id, is read from
    adapter_config.json)."""
    path = resolve_model(path, config.model.revision)
    check_model_dir(path)
    if (Path(path) / "adapter_config.json").is_file():
        adapters = adapter_config(path)
        try:
            from peft import PeftModel
        except ImportError as exc:
            raise ModelLoadError(f"{path!r} holds LoRA adapters; loading them needs peft: pip install peft") from exc
        base_dir = resolve_model(adapters["base_model_name_or_path"], adapters.get("revision"),
                                 key=f"the LoRA base model of {path!r}")
        check_adapters_fit(Path(path), adapters, base_dir)
        lm = PeftModel.from_pretrained(load_causal_lm(base_dir, config.model, device), path).to(device)
    else:
        lm = load_causal_lm(path, config.model, device)
    tokenizer = load_tokenizer(path)
    check_tokenizer_fits(tokenizer, lm, path)
    return lm.eval(), tokenizer


def adapter_config(path: str) -> dict[str, Any]:
    """A LoRA directory's adapter_config.json, which names its base model: a local directory or a Hub id (resolved,
    and refused in one line, as --model is); a local base that is gone is said here."""
    try:
        adapters = json.loads((Path(path) / "adapter_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path!r}: adapter_config.json cannot be read ({exc})") from None
    base = adapters.get("base_model_name_or_path")
    if not base or not (Path(base).expanduser().is_dir() or is_hub_id(base)):
        raise ModelLoadError(f"the LoRA adapters in {path!r} were trained on the base model {base!r}, which is not a "
                             f"local directory (moved or deleted?) nor a Hub id: put it back, or evaluate a merged "
                             f"model")
    return adapters


def check_adapters_fit(adapter_dir: Path, adapters: dict[str, Any], base_dir: str) -> None:
    """The adapters' target modules and shapes against the base adapter_config.json names, before either loads."""
    from transformers import AutoConfig

    try:
        base_config = AutoConfig.from_pretrained(base_dir)
    except Exception:  # of any type: the base's own load says what is wrong with it
        return
    problem = adapter_fit_problem(adapter_dir, adapters, base_config, adapters["base_model_name_or_path"])
    if problem:
        raise ModelLoadError(problem)


def check_saved_model(path: str) -> None:
    """A checkpoint's model/ is verified against the checkpoint's manifest before it loads, as a resume verifies it:
    before, a weight file damaged since the save (a flipped byte, a file from another checkpoint copied in) was
    evaluated as it was, and the scores reported as the checkpoint's."""
    checkpoint = checkpoint_of_model(Path(path))
    problems = [] if checkpoint is None else manifest_problems(checkpoint, under="model/")
    if problems:
        raise ModelLoadError(f"model directory {path!r} is checkpoint {checkpoint.name}'s and does not match its "
                             f"{MANIFEST_FILE}: {'; '.join(problems)}; evaluate another checkpoint")


def evaluation_data(data: DataConfig) -> Optional[str]:
    """What `eval` scores: data.eval_path when set (what training evaluates; `--data` unsets it), else data.path
    (None: the built-in task's held-out problems). Before, a training config's data.path was scored and its
    training-set accuracy printed as the evaluation's."""
    return data.eval_path if data.eval_path is not None else data.path


def run_eval(config: EngineConfig, model_path: str, num_samples: int, greedy: bool,
             batch_size: int) -> dict[str, float]:
    """`grpo-engine eval`: the evaluation data (evaluation_data) scored with config.rewards."""
    device = resolve_device(config.run.device)
    d = config.data
    data_path = evaluation_data(d)
    # The data and the reward functions before the model: a bad file is reported at once.
    rewards = load_reward_functions(config.rewards, config.rollout.max_new_tokens)
    if data_path is None:
        _, rows = addition_problems(d.builtin_max_operand, d.builtin_eval_size, config.run.seed)
        check_reward_columns(rewards, rows, "the built-in task", d.prompt_column)
    else:
        rows = load_prompt_rows(data_path, d.prompt_column, d.max_prompt_chars, d.config, d.eval_split,
                                d.system_prompt)
        check_reward_columns(rewards, rows, data_path, d.prompt_column)
    # The prompts rendered and tokenized, as train's preflight does, before any weight loads: a chat template that
    # refuses them or a prompt the tokenizer cannot encode is named by its row.
    where = f"dataset {data_path!r}" if data_path else "the built-in task"
    model_path = resolve_model(model_path, config.model.revision)
    check_saved_model(model_path)  # first: a file damaged since the save is named as such
    check_model_dir(model_path)
    unapplied = None if greedy else unapplied_model_sampling(model_path, config.rollout)
    if unapplied:
        _log.warning(f"warning: {unapplied}")
    tokenizer = load_tokenizer(model_path)
    prompts = render_prompts(rows, d.prompt_column, tokenizer, d.system_prompt, where)
    lengths = prompt_lengths(prompts, tokenizer, where)
    model_config = model_config_of(model_path, tokenizer)  # config.json: what fits, before any weight loads
    check_tokenizer_vocabulary(tokenizer, model_config, model_path)
    check_top_k_within_vocabulary(config.rollout, tokenizer, model_config)
    check_lengths_fit(lengths, model_positions(model_config), d.max_prompt_length, config.rollout.max_new_tokens, where)
    torch.manual_seed(config.run.seed)
    lm, tokenizer = load_eval_model(model_path, config, device)
    check_prompts_fit(prompts, tokenizer, lm, d.max_prompt_length, config.rollout.max_new_tokens, where)
    backend = HFRollout(lm, tokenizer, config.rollout, config.data.max_prompt_length, device)
    return evaluate_prompts(backend, rows, prompts, rewards, num_samples=num_samples, greedy=greedy,
                            batch_size=batch_size, prompt_column=config.data.prompt_column, source=where)
