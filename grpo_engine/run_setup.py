"""Everything the training loop needs, built once: models, data, rewards, optimizer, logger, resume state.

Kept apart from trainer.py so the loop reads on one screen. Order matters for exact resume: all
random-number consumers (model init, warm start) run before the sampling RNG is seeded or restored.
"""

from __future__ import annotations

import logging
import math
import re
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn

from grpo_kernels.config import LossConfigWarning

from .config import ConfigError, EngineConfig, LossConfig, config_from_dict, config_yaml, validate
from .config.applicability import inapplicable_settings
from .config.degenerate import degenerate_settings
from .data.demo_task import addition_problems, build_char_tokenizer, build_tiny_model, reference_completion
from .data.prompts import PromptSampler, data_fingerprint, load_prompt_rows, render_prompts
from .data.warm_start import supervised_warm_start
from .hub import resolve_model
from .rollout.model_sampling import unapplied_model_sampling
from .model.fsdp import check_fsdp, data_parallel_mesh, load_sharded_state, reshard, shard_policy
from .model.limits import (ModelFitError, check_prompts_fit, check_tokenizer_fits, restrict_vocabulary,
                           scored_vocab_size)
from .model.loading import (
    HiddenStatePolicy,
    add_lora,
    base_causal_lm,
    check_attention,
    enable_gradient_checkpointing,
    frozen_copy,
    load_causal_lm,
    load_lora_adapters,
    load_tokenizer,
    name_after_hub_id,
    resolve_device,
)
from .model.packed_attention import use_per_sequence_attention
from .model.master_weights import MasterWeightAdamW, trained_weights_adamw
from .model.update_precision import check_update_precision
from .preflight import preflight
from .model.tensor_parallel import SingleReplicaAccelerator, check_tensor_parallel
from .launch_agreement import check_processes_agree, launch_fingerprint, resume_label
from .lost_process import record_processes
from .process_group import join_processes, launched
from .rollout import RolloutBackend, check_backend, create_backend
from .state.file_size_limit import check_file_size_limit, largest_checkpoint_file
from .state import checkpoint as ckpt
from .state.atomic_file import write_atomically
from .state.health import RunHealth
from .state.metrics import MetricsLogger
from .state.resume import start_point
from .state.run_files import record_own
from .steps.packing import check_packed_attention
from .steps.rewards import NamedReward, check_reward_columns, code_fingerprint, load_reward_functions

_log = logging.getLogger(__name__)  # grpo_engine/messages.py: how the CLI shows it

BASE_MODEL_DIR = "base_model"  # where the built-in demo's (warm-started) starting model is written


@dataclass
class Run:
    config: EngineConfig
    accelerator: Accelerator | SingleReplicaAccelerator  # the latter under tensor parallelism
    run_dir: Path
    tokenizer: Any
    policy: nn.Module  # HiddenStatePolicy, wrapped by accelerate (DDP) when distributed, or sharded (FSDP)
    lm: nn.Module  # the unwrapped causal LM (peft model under LoRA)
    reference: Optional[HiddenStatePolicy]  # None: no KL, or LoRA (adapters disabled)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    rewards: list[NamedReward]
    rows: list[dict[str, Any]]
    data: dict[str, dict[str, Any]]  # the fingerprints of the training (and evaluation) rows, kept in checkpoints
    prompts: list[str]  # rendered prompt text per row
    eval_rows: list[dict[str, Any]]
    eval_prompts: list[str]
    sampler: PromptSampler
    logger: MetricsLogger
    start_step: int  # last completed step (0 for a fresh run)
    config_yaml: str  # the config as saved in run_dir and in every checkpoint
    rollout_backend: RolloutBackend  # what samples the completions (rollout.backend)
    num_tokens: int = 0  # prompt + completion tokens of all steps so far (TRL's num_tokens)
    health: RunHealth = field(default_factory=RunHealth)

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    @property
    def world(self) -> Accelerator:
        """Every process, which under tensor parallelism `accelerator` (one replica) does not show."""
        return self.accelerator.world if isinstance(self.accelerator, SingleReplicaAccelerator) else self.accelerator

    @property
    def tensor_parallel(self) -> bool:
        return self.config.model.tensor_parallel > 1

    @property
    def fsdp(self) -> bool:
        return self.config.model.fsdp

    @cached_property
    def row_positions(self) -> dict[int, int]:
        """Each training row's position in the data, by the row object's identity: the sampler draws these very
        dicts, so a message about a completion can name the dataset row its prompt came from."""
        return {id(row): i for i, row in enumerate(self.rows)}

    @property
    def unwrapped_policy(self) -> HiddenStatePolicy:
        return self.accelerator.unwrap_model(self.policy)

    def trainer_state(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict(), "num_tokens": self.num_tokens, "data": self.data}


def lr_lambda(kind: str, warmup_steps: int, total_steps: int):
    """The multiplier of the base LR after `step` optimizer steps: linear warmup, then constant/linear/cosine."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        if kind == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return factor


def _builtin_base_model(config: EngineConfig, accelerator: Accelerator, base_dir: Path, device: torch.device,
                        rebuild: bool) -> None:
    """Build, warm-start and save the demo model (main process); every process then loads it.

    A fresh run rebuilds it (a few seconds, deterministic), so a changed warm start never meets a stale
    copy; a resumed run must find the one its checkpoints started from.
    """
    if not rebuild and not (base_dir / "config.json").is_file():
        raise ckpt.CheckpointError(f"cannot resume: the built-in run's starting model {base_dir} is missing")
    if accelerator.is_main_process and rebuild:
        tokenizer = build_char_tokenizer()
        lm = build_tiny_model(tokenizer, config.run.seed).to(device)
        train_rows, _ = addition_problems(config.data.builtin_max_operand, config.data.builtin_eval_size,
                                          config.run.seed)
        if config.run.warm_start_steps:
            warm = supervised_warm_start(
                lm, tokenizer, [r["prompt"] for r in train_rows], [reference_completion(r) for r in train_rows],
                config.run.warm_start_steps, config.run.warm_start_learning_rate, batch_size=64,
                seed=config.run.seed, device=device, backend=config.run.loss_backend,
                target=config.run.warm_start_target)
            nll = f", NLL {warm.losses[0]:.3f} -> {warm.losses[-1]:.3f}" if warm.losses else ""
            _log.info(f"warm start: {len(warm.losses)} supervised steps{nll}, mean probability of the reference "
                     f"answers {warm.answer_probability:.3f}")
        check_file_size_limit(largest_checkpoint_file(lm), "the model's checkpoint files")  # before the first save
        lm.save_pretrained(base_dir)
        tokenizer.save_pretrained(base_dir)
        record_own(base_dir.parent, base_dir.name)
    accelerator.wait_for_everyone()


def _load_data(config: EngineConfig, rewards: list[NamedReward]) -> tuple[list[dict], list[dict]]:
    """The training and evaluation rows, checked against the prompt settings and the columns the reward
    functions read: a bad file stops the run before the model loads, not at step 1."""
    d = config.data
    if d.path is None:
        rows, eval_rows = addition_problems(d.builtin_max_operand, d.builtin_eval_size, config.run.seed)
        check_reward_columns(rewards, rows, "the built-in task", d.prompt_column)
        return rows, eval_rows
    rows = load_prompt_rows(d.path, d.prompt_column, d.max_prompt_chars, d.config, d.split, d.system_prompt)
    check_reward_columns(rewards, rows, d.path, d.prompt_column)
    eval_rows = []
    if d.eval_path is not None:
        eval_rows = load_prompt_rows(d.eval_path, d.prompt_column, d.max_prompt_chars, d.config, d.eval_split,
                                     d.system_prompt)
        check_reward_columns(rewards, eval_rows, d.eval_path, d.prompt_column)
    return rows, eval_rows


def data_source_name(source: Optional[str]) -> str:
    """How messages name a dataset: its path, or the built-in task."""
    return f"dataset {source!r}" if source else "the built-in task"


def check_model_takes_the_data(config: EngineConfig, tokenizer: Any, lm: nn.Module, path: str, prompts: list[str],
                               eval_prompts: list[str]) -> None:
    """The tokenizer's ids inside the model's vocabulary and every prompt inside its positions, before step 1. A
    refusal that names a setting the demo's preset sets, where naming a model dropped that preset, says so."""
    try:
        check_tokenizer_fits(tokenizer, lm, path)
        for texts, source in ((prompts, config.data.path), (eval_prompts, config.data.eval_path)):
            check_prompts_fit(texts, tokenizer, lm, config.data.max_prompt_length, config.rollout.max_new_tokens,
                              f"dataset {source!r}" if source else "the built-in task")
    except ModelFitError as exc:
        note = dropped_preset_note(config, str(exc))
        if not note:
            raise
        raise ModelFitError(f"{exc} ({note})") from None


def dropped_preset_note(config: EngineConfig, message: str) -> str:
    """What naming a model changed among the settings `message` names: each one the demo's preset sets that is at
    the schema's default in this run (the preset applies only to the built-in model)."""
    from .data.demo_task import DEMO_PRESET

    if config.model.name_or_path is None:
        return ""
    defaults, now = config_from_dict({}).model_dump(), config.model_dump()
    dropped = [f"{section}.{key} is {now[section][key]!r}, the default, where the demo's preset has {value!r}"
               for section, keys in DEMO_PRESET.items() for key, value in keys.items()
               if f"{section}.{key}" in message and now[section][key] == defaults[section][key] != value]
    if not dropped:
        return ""
    return (f"naming a model (--model) drops the demo's preset: {'; '.join(dropped)}; set "
            f"{' '.join('--' + d.split(' is ')[0] + ' VALUE' for d in dropped)}")


def run_defaults(config: EngineConfig) -> tuple[EngineConfig, ...]:
    """What this run's settings are compared with: the schema's defaults, and the demo's preset too when the run
    uses the built-in model (the command line lays it under the flags; a config built in Python may not have it)."""
    from .data.demo_task import DEMO_PRESET

    schema = config_from_dict({})
    return (schema,) if config.model.name_or_path is not None else (schema, config_from_dict(DEMO_PRESET))


def sampling_warnings(config: EngineConfig) -> list[str]:
    """What makes the samples off-policy for the trainer, said once at the start."""
    r = config.rollout
    notes = []
    if r.repetition_penalty != 1.0:
        notes.append(f"rollout.repetition_penalty={r.repetition_penalty} changes the sampling distribution itself, "
                     "which the trainer's log-probs do not reproduce: the samples are off-policy (see the "
                     "sampling/trainer_sampler_ratio/* metrics)")
    if (r.top_p < 1.0 or r.top_k > 0) and not r.replays_kept_tokens():
        notes.append("rollout.replay_kept_tokens=false with top_p/top_k truncation: the trainer scores the whole "
                     "vocabulary, so the importance ratio of on-policy tokens sits at the kept mass, not 1")
    return notes


def loss_warnings(config: EngineConfig) -> list[str]:
    """The kernels' warnings on the loss settings (a combination TRL accepts with a warning: it does not follow the
    loss type's paper), in the engine's keys: `loss_type='bnpo'` is written `loss.loss_type bnpo` here."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LossConfigWarning)
        config.loss_config(quiet=False)
    keys = "|".join(LossConfig.model_fields)
    return [re.sub(rf"\b({keys})=(['\"]?)([^'\"\s,;]+)\2", r"loss.\1 \3", str(warning.message))
            for warning in caught if issubclass(warning.category, LossConfigWarning)]


def set_thread_count(threads: Optional[int]) -> None:
    """torch's CPU threads: run.num_threads, at most one per CPU this process may run on (more only oversubscribe
    them, and a count in the thousands made OpenMP fail to create its threads or crash the process). Checked on the
    machine that runs (not in the schema: a saved run's config stays loadable anywhere, and --resume may change it)."""
    if threads is None:
        return
    from .resource_limits import usable_cpus

    cpus = usable_cpus()
    if threads > cpus:
        raise ConfigError(f"run.num_threads: expected at most the {cpus} CPU{'s' * (cpus != 1)} this process may run "
                          f"on, got {threads}")
    torch.set_num_threads(threads)


def setup_run(config: EngineConfig) -> Run:
    device = resolve_device(config.run.device)
    set_thread_count(config.run.num_threads)
    world = join_processes(cpu=device.type == "cpu", timeout_s=config.run.distributed_timeout_s)
    if launched():
        record_processes()  # which process runs where: to name one lost mid-run
    check_tensor_parallel(config, world.num_processes)
    check_fsdp(config, world.num_processes)
    accelerator = world if config.model.tensor_parallel == 1 else SingleReplicaAccelerator(world)  # TP: all processes, one replica
    validate(config, accelerator.num_processes)  # the batch rule depends on the number of (data) processes
    check_backend(config, device, world.num_processes, world.process_index)  # what the rollout backend cannot do, before any loading
    check_attention(config.model, device)
    if accelerator.is_main_process:
        for message in (loss_warnings(config) + sampling_warnings(config)
                        + inapplicable_settings(config, *run_defaults(config)) + degenerate_settings(config)):
            _log.warning(f"warning: {message}")
    rewards = load_reward_functions(config.rewards, config.rollout.max_new_tokens)
    rows, eval_rows = _load_data(config, rewards)
    hub_model = config.model.name_or_path
    with world.main_process_first():  # one process downloads a Hub id; the others then find it in the cache
        base_path = None if hub_model is None else resolve_model(hub_model, config.model.revision)
    notes = preflight(config, rows, eval_rows, base_path)  # settings x data x machine, before any weight loads
    for note in notes if accelerator.is_main_process else []:
        _log.warning(f"warning: {note}")
    unapplied = None if base_path is None else unapplied_model_sampling(base_path, config.rollout)
    if unapplied and accelerator.is_main_process:
        _log.warning(f"warning: {unapplied}")
    run_dir = Path(config.run.output_dir)
    data = {"train": data_fingerprint(rows, repr(config.data.path) if config.data.path else "of the built-in task")}
    reward_code = code_fingerprint(rewards)
    if reward_code is not None:
        data["rewards"] = reward_code
    if eval_rows:
        data["eval"] = data_fingerprint(eval_rows, repr(config.data.eval_path) if config.data.eval_path
                                        else "of the built-in task")
    if launched():  # every process starts from the same settings, files, checkpoint and packages, before any work
        check_processes_agree(launch_fingerprint(config, base_path, data, resume_label(config.run.resume, run_dir),
                                                 rewards, run_dir))
    resume_point = start_point(config, run_dir, announce=accelerator.is_main_process, data=data,
                               processes=accelerator.num_processes)
    resume_from = None if resume_point is None else resume_point.path
    tp, fsdp = config.model.tensor_parallel, config.model.fsdp
    # Read and checked before any weight loads: a state the run cannot apply is refused now, not after the model.
    state = None if resume_from is None else ckpt.load_training_state(
        resume_from, accelerator.process_index, optimizer_shard=None if tp == 1 else world.process_index,
        sharded_optimizer=fsdp, check_against_model=tp == 1 and not fsdp)
    sampler = PromptSampler(len(rows), config.run.seed, config.data.shuffle)
    if state is not None:
        with ckpt.restoring(resume_from / ckpt.STATE_FILE):  # its fields' types: checked by its schema already
            sampler.load_state_dict(state["trainer"]["sampler"])
    if accelerator.is_main_process:
        # Written only once the run is known to use this config (a refused resume leaves the old one).
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(run_dir / "config.yaml", config_yaml(config))
        record_own(run_dir, "config.yaml")  # a start that fails leaves nothing in the corrected command's way
    set_seed(config.run.seed)  # identical model init on every process

    if base_path is None:
        base_path = str(run_dir / BASE_MODEL_DIR)
        _builtin_base_model(config, accelerator, Path(base_path), accelerator.device, rebuild=resume_from is None)
    tokenizer = load_tokenizer(base_path)
    d = config.data
    prompts = render_prompts(rows, d.prompt_column, tokenizer, d.system_prompt, data_source_name(d.path))
    eval_prompts = render_prompts(eval_rows, d.prompt_column, tokenizer, d.system_prompt, data_source_name(d.eval_path))
    lora = config.model.lora.enabled
    # A resumed FSDP run loads its weights from the sharded checkpoint, into the starting model's structure.
    policy_path = base_path if resume_from is None or lora or fsdp else ckpt.model_dir(resume_from)
    # FSDP: loaded whole on the CPU; sharding moves each process's shard to the device.
    lm = load_causal_lm(policy_path, config.model, accelerator.device, tp, keep_on_cpu=fsdp)
    if hub_model is not None and Path(base_path) != Path(hub_model).expanduser():
        name_after_hub_id(lm, hub_model)  # LoRA checkpoints then name their base by its id, not a cache path
    reference = None
    if config.loss.beta != 0.0 and not lora:
        # The reference is the starting model: the freshly loaded one, or reloaded from the base on resume
        # (and always under TP, whose sharded model is loaded rather than copied).
        start = lm if policy_path == base_path and tp == 1 else load_causal_lm(
            base_path, config.model, accelerator.device, tp, keep_on_cpu=fsdp)
        reference = HiddenStatePolicy(frozen_copy(start) if start is lm else start.requires_grad_(False).eval())
    if lora:
        if resume_from is None:
            lm = add_lora(lm, config.model.lora)
        else:
            lm = load_lora_adapters(lm, ckpt.model_dir(resume_from))
    check_model_takes_the_data(config, tokenizer, lm, base_path, prompts, eval_prompts)
    scored = scored_vocab_size(tokenizer, lm, config.rollout.sample_padded_vocab)
    for model in (lm, None if reference is None else reference.lm):
        if model is not None:
            restrict_vocabulary(model, scored)
            if config.optim.padding_free:  # sdpa's packs then cost what their sequences cost
                use_per_sequence_attention(base_causal_lm(model))
    if config.model.gradient_checkpointing:
        enable_gradient_checkpointing(lm)
    policy = HiddenStatePolicy(lm).train()
    if fsdp:  # before the optimizer, which then holds this process's shards only
        mesh = data_parallel_mesh(accelerator.device)
        policy = shard_policy(policy, mesh)
        if reference is not None:
            reference = shard_policy(reference, mesh)
    if config.optim.padding_free:
        check_packed_attention(policy, base_causal_lm(lm).config.vocab_size, accelerator.device)
        reshard(policy)  # no backward follows this forward

    o = config.optim
    trained = [p for p in policy.parameters() if p.requires_grad]
    optimizer = trained_weights_adamw(o.master_weights, trained, lr=o.learning_rate,
                                      betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_epsilon,
                                      weight_decay=o.weight_decay)
    check_update_precision(accelerator, trained, o.learning_rate, o.adam_epsilon, config.model.dtype,
                           float32_steps=isinstance(optimizer, MasterWeightAdamW))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(
        o.lr_scheduler_type, config.warmup_steps(), config.optimizer_steps()))
    if tp == 1 and not fsdp:  # neither a tensor-parallel nor a sharded model is wrapped in DDP
        policy, optimizer = accelerator.prepare(policy, optimizer)

    start_step, num_tokens = 0, 0
    if state is not None:
        if fsdp:
            load_sharded_state(resume_from / ckpt.SHARDED_DIR, lm, optimizer)
        else:
            with ckpt.restoring(resume_from / ckpt.optimizer_file(None if tp == 1 else world.process_index)):
                optimizer.load_state_dict(state["optimizer"])
        with ckpt.restoring(resume_from / "scheduler.pt"):
            scheduler.load_state_dict(state["scheduler"])
        with ckpt.restoring(resume_from / f"rng-{accelerator.process_index}.pt"):
            ckpt.set_rng_state(state["rng"])
        start_step = int(state["trainer"]["step"])
        num_tokens = int(state["trainer"].get("num_tokens", 0))
    else:
        set_seed(config.run.seed + accelerator.process_index)  # distinct samples on each process

    # Last: a vLLM engine starts from the model directory and is then given the policy's weights as they are now
    # (LoRA merged, or resumed from a checkpoint).
    # HF samples from the LM, or under FSDP from the sharded policy, whose `generate` gathers the root first.
    backend = create_backend(config, policy if fsdp else lm, lm, tokenizer, accelerator.device,
                             policy_path if not lora else base_path, world, str(run_dir), start_step)
    logger = MetricsLogger(run_dir, config.run.report_to, accelerator.is_main_process,
                           config=config.model_dump(), resume_step=start_step if resume_from else None,
                           resume_checkpoint=resume_from)
    return Run(config, accelerator, run_dir, tokenizer, policy, lm, reference, optimizer, scheduler, rewards, rows,
               data, prompts, eval_rows, eval_prompts, sampler, logger, start_step,
               config_yaml(config), backend, num_tokens)
