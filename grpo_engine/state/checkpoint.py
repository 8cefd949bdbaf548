"""Atomic, verified, resumable checkpoints: HF-format model (or LoRA adapters) + tokenizer, optimizer,
scheduler, every process's RNG state, the data position and the run's config.

A checkpoint is written to a hidden temporary directory and renamed into place only when complete, so an
interrupted save never replaces (or corrupts) the last good one; loaders ignore the temporary names. Its
last file is a manifest of every file's size and SHA-256, checked before resuming: a truncated or corrupted
file (even one that still loads) is reported by name, and so are weights holding NaN or inf (a diverged run
saves them intact); `latest` falls back to the newest sound one. A save that fails (a full disk) removes its
partial directory and stops with one line.
"""

from __future__ import annotations

import errno
import logging
import hashlib
import json
import os
import random
import re
import shutil
from pathlib import Path
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import numpy as np
import torch
from accelerate import Accelerator

from ..model.fsdp import full_state_dict, is_fully_sharded, save_sharded_state
from ..model.tensor_parallel import is_tensor_parallel
from ..config.strict_yaml import MAX_CONFIG_BYTES
from .bounded_read import read_bounded_bytes, read_json_file
from .checkpoint_error import CheckpointError
from .manifest_coverage import unverified_files
from .saved_state import (ADAPTER_FILE, check_optimizer_state, check_rng_state, check_scheduler_state,
                          check_sharded_metadata, load_plain, plain_rng_state, saved_tensor_shapes,
                          weight_files)
from .run_files import (CHECKPOINT_NAME, CHECKPOINT_PREFIX, STATE_FILE, checkpoint_root, checkpoint_step,  # noqa: F401
                        list_checkpoints)
from .resume_target import check_resume_target
from .run_lock import check_checkpoint_entries
from .trainer_state import trainer_state_problem
from .metrics import save_history

_log = logging.getLogger(__name__)  # grpo_engine/messages.py: how the CLI shows it

PREFIX = CHECKPOINT_PREFIX
MANIFEST_FILE = "checksums.json"
CONFIG_FILE = "config.yaml"  # the config the run was using when it saved this checkpoint
SHARDED_DIR = "sharded"  # under model.fsdp: every process's shard of the weights and AdamW state (grpo_engine.model.fsdp)


def remove_checkpoint(path: Path) -> None:
    """Rotation: a checkpoint directory is deleted; a link to one (moved elsewhere by its user) is unlinked, and
    what it points to is left where the user put it, said in one line. A deletion that fails is a warning: the new
    checkpoint is saved and the run goes on."""
    if path.is_symlink():
        target = path.resolve()
        path.unlink()
        _log.warning(f"note: {path} was a link to {target}; rotation (run.save_total_limit) removed the link and "
                     f"left {target} where it is")
    else:
        try:
            shutil.rmtree(path)
        except OSError as exc:
            # Housekeeping after a good save: a file another user owns, an immutable or busy one (NFS's .nfsXXXX)
            # ended a run whose newest checkpoint was saved with an error naming a bare file name.
            failed = Path(exc.filename).name if exc.filename else "a file"
            _log.warning(f"warning: rotation (run.save_total_limit) could not remove {path} ({failed}: "
                         f"{exc.strerror or exc}); the run goes on, and that checkpoint stays, perhaps in part: remove "
                         f"it yourself")


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_manifest(directory: Path) -> None:
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)
    manifest = {str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256": file_sha256(p)} for p in files}
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))


def checkpoint_problems(path: Path) -> list[str]:
    """What is wrong with a checkpoint, one entry per damaged file; empty when it is intact."""
    problems = []
    try:
        state = read_json_file(path / STATE_FILE, "a checkpoint's trainer state")
        step, named = state.get("step") if isinstance(state, dict) else None, checkpoint_step(path)
        wrong = trainer_state_problem(state)
        if named is not None and step != named:
            problems.append(f"{STATE_FILE} holds step {step!r}, not the {named} of the directory's name (a copy "
                            f"renamed?)")
        elif wrong is not None:
            problems.append(f"{STATE_FILE} {wrong}")
    except (OSError, ValueError) as exc:
        problems.append(f"{STATE_FILE} is unreadable ({exc})")
    return problems + manifest_problems(path) or nonfinite_weights(path)


def manifest_problems(path: Path, under: str = "") -> list[str]:
    """What the checkpoint `path`'s manifest finds wrong with its files (those under the directory `under` only,
    given one: its model/), one entry per damaged file; empty when they are intact."""
    try:
        manifest = read_json_file(path / MANIFEST_FILE, "a checkpoint's manifest")
    except FileNotFoundError:
        return [f"{MANIFEST_FILE} is missing, so the files cannot be verified"]
    except (OSError, ValueError) as exc:
        return [f"{MANIFEST_FILE} is unreadable ({exc})"]
    if not isinstance(manifest, dict) or not all(
            isinstance(entry, dict) and isinstance(entry.get("bytes"), int) and isinstance(entry.get("sha256"), str)
            for entry in manifest.values()):
        return [f"{MANIFEST_FILE} is unreadable (not a mapping of file names to their bytes and sha256)"]
    problems = []
    for name, expected in manifest.items():
        file = path / name
        if not name.startswith(under):
            continue
        if not file.is_file():
            problems.append(f"{name} is missing")
        elif file.stat().st_size != expected["bytes"]:
            problems.append(f"{name} is truncated or overwritten ({file.stat().st_size} bytes, saved with "
                            f"{expected['bytes']})")
        elif file_sha256(file) != expected["sha256"]:
            problems.append(f"{name} is corrupted (its SHA-256 differs from the one saved with it)")
    for name in unverified_files(path, set(manifest)):
        if name.startswith(under):
            problems.append(f"{name} is not among the files {MANIFEST_FILE} verifies (added after the save, or its "
                            f"entry removed?), so it cannot be verified")
    return problems


def checkpoint_of_model(model_dir: Path) -> Optional[Path]:
    """The checkpoint whose model/ `model_dir` is (its trainer state and manifest beside it), or None."""
    parent = model_dir.parent
    if model_dir.name == "model" and (parent / STATE_FILE).is_file() and (parent / MANIFEST_FILE).is_file():
        return parent
    return None


def nonfinite_weights(path: Path) -> list[str]:
    """The first weight tensor holding NaN or inf in each of the checkpoint's model files (resuming from it
    would fail only later, in sampling, with "probability tensor contains either inf, nan or element < 0")."""
    from safetensors import safe_open

    problems = []
    for file in weight_files(path / "model"):
        bad = []
        try:
            with safe_open(file, framework="pt") as weights:
                for name in weights.keys():
                    tensor = weights.get_tensor(name)
                    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                        bad.append((name, tensor))
        except Exception as exc:  # safetensors' own error type: a file that matches its checksum but is no model
            problems.append(f"{file.relative_to(path)} cannot be read as safetensors ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else 'no detail'})")
            continue
        if bad:
            name, tensor = bad[0]
            kinds = " and ".join(kind for kind, test in (("NaN", torch.isnan), ("inf", torch.isinf))
                                 if bool(test(tensor).any()))
            count = int((~torch.isfinite(tensor)).sum())
            more = f", and {len(bad) - 1} more tensors hold non-finite values" if len(bad) > 1 else ""
            problems.append(f"{file.relative_to(path)}: tensor {name!r} holds {kinds} ({count} of "
                            f"{tensor.numel()} values){more}")
    return problems


@dataclass
class ResumePoint:
    path: Path
    step: int
    skipped: list[str]  # damaged newer checkpoints passed over, with their problems


def resolve_resume(resume: str, run_dir: str | Path) -> ResumePoint:
    """The checkpoint to resume from: the given one, which must be intact, or the newest intact one."""
    check_checkpoint_entries(run_dir)
    check_resume_target(resume, run_dir)  # before a partial save it names is removed below
    recover_interrupted_swaps(run_dir)
    stopped = remove_stopped_saves(run_dir)
    if resume != "latest":
        path = Path(resume)
        problems = checkpoint_problems(path)
        if problems:
            raise CheckpointError(f"checkpoint {path} is damaged: {'; '.join(problems)}. Resume from another one "
                                  f"(--resume with no value picks the newest intact checkpoint)")
        return ResumePoint(path, _step(path), stopped)
    if not checkpoint_root(run_dir).is_dir():  # no run saved here: said with the path as the process reads it
        relative = "" if Path(run_dir).is_absolute() else f", read from the working directory {Path.cwd()}"
        raise CheckpointError(f"run.resume='latest' but {Path(run_dir).absolute()} holds no checkpoints/, so no "
                              f"complete checkpoint (no run has saved there{relative}): name the run's own directory "
                              f"with --output-dir, or leave out --resume to start a new run")
    found = list_checkpoints(run_dir)
    if not found:
        raise CheckpointError(f"run.resume='latest' but {checkpoint_root(run_dir)} has no complete checkpoint "
                              f"(the run stopped before its first save?): {START_AGAIN}")
    skipped = stopped
    for path in reversed(found):
        problems = checkpoint_problems(path)
        if not problems:
            return ResumePoint(path, _step(path), skipped)
        skipped.append(f"{path.name} is damaged: {'; '.join(problems)}")
    raise CheckpointError(f"no intact checkpoint in {checkpoint_root(run_dir)}: " + "; ".join(skipped))


def _step(path: Path) -> int:
    step = read_json_file(path / STATE_FILE, "a checkpoint's trainer state").get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{path / STATE_FILE}: \"step\" is {step!r}, not a step the engine writes (an "
                              f"integer >= 0); resume from another checkpoint")
    return step


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(accelerator: Accelerator, run_dir: str | Path, step: int, *args: Any, **kwargs: Any) -> Path:
    """Write checkpoint-<step> atomically on every process's behalf (the arguments of `_write_checkpoint`);
    returns its path. A write that fails removes the partial directory, which on a full disk would otherwise
    keep it full; a full disk stops the run with one line that says so, the last good checkpoint untouched."""
    try:
        return _write_checkpoint(accelerator, run_dir, step, *args, **kwargs)
    except BaseException as exc:  # a second Ctrl-C during the save too: no partial directory stays behind
        tmp, final = temporary_dir(run_dir, step), checkpoint_root(run_dir) / f"{PREFIX}{step:06d}"
        disk_full = isinstance(exc, Exception) and is_disk_full(exc, checkpoint_root(run_dir))  # before the removal
        shutil.rmtree(tmp, ignore_errors=True)
        if not disk_full:
            raise
        earlier = list_checkpoints(run_dir)  # complete ones only: all untouched by this save
        then = (f"the last good checkpoint is {earlier[-1]}. Free some space, then continue with --resume"
                if earlier else f"there is no earlier checkpoint to resume from. Free some space, then {START_AGAIN}")
        raise CheckpointError(f"no space left on device while saving {final}: the partial {tmp.name} was removed; "
                              f"{then}") from exc


# What a run that saved no checkpoint can do: its directory holds its logs, which a fresh start will not mix with its
# own.
START_AGAIN = "start the run again without --resume, in another --output-dir (or after deleting this one)"

DISK_FULL_MESSAGES = ("No space left on device", "Disk quota exceeded", "os error 28", "os error 122")
# torch's zip writer reports a failed write without its errno: "unexpected pos" or "file write failed".
TORCH_WRITE_FAILED = ("unexpected pos", "file write failed")


def is_disk_full(exc: BaseException, directory: Path) -> bool:
    """Whether `exc` (or what caused it) is a write that found no space: ENOSPC / EDQUOT, as an errno or in a
    library's message, or a failed write of torch's with (almost) nothing free on `directory`'s filesystem."""
    torch_write_failed, seen = False, set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(exc)
        if any(message in text for message in DISK_FULL_MESSAGES):
            return True
        torch_write_failed |= "inline_container" in text and any(m in text for m in TORCH_WRITE_FAILED)
        exc = exc.__cause__ or exc.__context__
    if not torch_write_failed:
        return False
    try:
        return shutil.disk_usage(directory).free < 2**20
    except OSError:
        return False


def stale_dir(run_dir: str | Path, step: int) -> Path:
    """Where checkpoint-<step> waits while a re-save of that step takes its place."""
    return checkpoint_root(run_dir) / f".old-{PREFIX}{step:06d}"


def recover_interrupted_swaps(run_dir: str | Path) -> None:
    """A re-save stopped between its two renames leaves the step's earlier checkpoint as .old-checkpoint-N and
    no checkpoint-N: it is put back (it was complete); one whose swap completed is dropped."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return
    for stale in root.glob(f".old-{PREFIX}*"):
        final = root / stale.name[len(".old-"):]
        if checkpoint_step(final) is None:
            continue
        if final.is_dir():
            remove_checkpoint(stale)
        elif final.exists() or final.is_symlink():
            continue  # not a checkpoint (a user's file or link): check_checkpoint_entries names it; both stay
        else:
            os.replace(stale, final)


def remove_stopped_saves(run_dir: str | Path) -> list[str]:
    """The partial directories of saves whose process was killed while writing them (SIGKILL, a power loss: no
    handler ran), removed (they only hold disk space); one note each, naming it."""
    root = checkpoint_root(run_dir)
    notes = []
    for partial in sorted(root.glob(f".tmp-{PREFIX}*")) if root.is_dir() else ():
        if checkpoint_step(partial.with_name(partial.name[len(".tmp-"):])) is None or not partial.is_dir() or \
                partial.is_symlink():
            continue  # check_checkpoint_entries names what is not a directory
        shutil.rmtree(partial)
        notes.append(f"{partial} is a save that never completed (its process was stopped while writing it): removed")
    return notes


def temporary_dir(run_dir: str | Path, step: int) -> Path:
    """Where checkpoint-<step> is written before it is renamed into place."""
    return checkpoint_root(run_dir) / f".tmp-{PREFIX}{step:06d}"


def _write_checkpoint(accelerator: Accelerator, run_dir: str | Path, step: int, lm: torch.nn.Module, tokenizer,
                      optimizer: torch.optim.Optimizer, scheduler, trainer_state: dict[str, Any],
                      keep_last: int, config_yaml: str) -> Path:
    root = checkpoint_root(run_dir)
    final = root / f"{PREFIX}{step:06d}"
    tmp = temporary_dir(run_dir, step)
    if accelerator.is_main_process:
        check_checkpoint_entries(run_dir)  # a file or dangling link put at checkpoint-<step> since the start: named
        recover_interrupted_swaps(run_dir)
        if tmp.exists():
            shutil.rmtree(tmp)  # the leftovers of an interrupted save
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    # Each data-parallel process keeps its own RNG stream (sampling differs per process); under tensor
    # parallelism (one replica, `accelerator.num_processes` 1) every rank has the main process's stream.
    if accelerator.num_processes > 1 or accelerator.is_main_process:
        torch.save(plain_rng_state(rng_state()), tmp / f"rng-{accelerator.process_index}.pt")
    tensor_parallel = is_tensor_parallel(lm)
    if tensor_parallel:
        # Every rank takes part: transformers gathers the shards into whole weights, which the main one writes
        # (the checkpoint loads without TP); each rank's optimizer state is its own shard's.
        lm.save_pretrained(tmp / "model", is_main_process=accelerator.is_main_process, safe_serialization=True)
        torch.save(optimizer.state_dict(), tmp / optimizer_file(torch.distributed.get_rank()))
    fully_sharded = is_fully_sharded(lm)
    if fully_sharded:
        # Every process takes part: the whole weights are gathered onto the main one (model/ loads without
        # FSDP), and each writes its shard of the weights and AdamW state, from which the run resumes.
        state_dict = full_state_dict(lm)
        save_sharded_state(tmp / SHARDED_DIR, lm, optimizer)
    else:
        state_dict = accelerator.get_state_dict(lm) if accelerator.distributed_type.name.startswith("FSDP") else None
    if accelerator.is_main_process:
        if not tensor_parallel:
            lm.save_pretrained(tmp / "model", state_dict=state_dict, safe_serialization=True)
        if not (tensor_parallel or fully_sharded):
            torch.save(optimizer.state_dict(), tmp / optimizer_file(None))
        tokenizer.save_pretrained(tmp / "model")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        (tmp / STATE_FILE).write_text(json.dumps({**trainer_state, "step": step}, indent=2))
        (tmp / CONFIG_FILE).write_text(config_yaml)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        save_history(Path(run_dir), tmp, step)
        write_manifest(tmp)  # last: it covers every process's files
        if final.exists():  # re-saving a step (a resumed run): swap, then drop the old copy
            stale = stale_dir(run_dir, step)
            os.replace(final, stale)  # stopped before the next rename: recover_interrupted_swaps puts it back
            os.replace(tmp, final)
            remove_checkpoint(stale)
        else:
            os.replace(tmp, final)
        for old in list_checkpoints(run_dir)[:-keep_last]:
            remove_checkpoint(old)
    accelerator.wait_for_everyone()
    return final


def check_saved_processes(path: Path, processes: int) -> None:
    """A checkpoint resumes with the number of data-parallel processes that saved it (one rng-<process>.pt each):
    with another, each step's generation batch and the processes' random streams differ from the run it continues
    (a resume of 2 processes' checkpoint by 1 trained on silently with half the batch). Every process decides it
    from the same files, so all stop together."""
    saved = sum(1 for p in path.iterdir() if re.fullmatch(r"rng-[0-9]+\.pt", p.name))
    if saved == processes:
        return
    counted = f"{saved} data-parallel process{'es' * (saved != 1)}"
    raise CheckpointError(f"cannot resume {path}: it was saved by {counted} (its rng-<process>.pt files) and this run "
                          f"has {processes}: each step's generation batch and each process's random stream would "
                          f"differ from the run it continues; resume it with the launch it was saved with "
                          f"({counted}: torchrun --nproc_per_node {saved}), or start a "
                          f"new run in another --output-dir")


def optimizer_file(shard: Optional[int]) -> str:
    """optimizer.pt, or one file per tensor-parallel rank (`shard`), each holding that rank's shard's state."""
    return "optimizer.pt" if shard is None else f"optimizer-tp{shard}.pt"


def load_training_state(path: Path, process_index: int, optimizer_shard: Optional[int] = None,
                        sharded_optimizer: bool = False, check_against_model: bool = False) -> dict[str, Any]:
    """Trainer state, optimizer (this tensor-parallel rank's, given `optimizer_shard`; none with
    `sharded_optimizer`, which the caller loads from the FSDP checkpoint: grpo_engine.model.fsdp) and scheduler state
    dicts, and this process's RNG state: read with weights_only (saved_state.load_plain) and each checked to be a
    state the run can apply, before any model loads. `check_against_model`: the optimizer's moments are also
    compared with the shapes of the checkpoint's own model files, the weights (or adapters) the run then loads."""
    rng_file = path / f"rng-{process_index}.pt"
    if not rng_file.is_file():
        raise CheckpointError(f"{path} has no RNG state for process {process_index}: it was saved with fewer "
                              f"processes; resume with the same number of processes")
    files = {"scheduler": path / "scheduler.pt", "rng": rng_file}
    if sharded_optimizer:
        if not (path / SHARDED_DIR).is_dir():
            raise CheckpointError(f"{path} has no {SHARDED_DIR}/ weights and optimizer state: it was saved without "
                                  f"model.fsdp; resume with the options it was saved with")
        check_sharded_metadata(path / SHARDED_DIR / ".metadata")
    else:
        files["optimizer"] = path / optimizer_file(optimizer_shard)
        if not files["optimizer"].is_file():
            raise CheckpointError(f"{path} has no {files['optimizer'].name}: it was saved with another "
                                  f"model.tensor_parallel; resume with the same model.tensor_parallel and number "
                                  f"of processes")
    try:
        state = {"trainer": read_json_file(path / STATE_FILE, "a checkpoint's trainer state")}
    except Exception as exc:
        raise CheckpointError(f"cannot read {path / STATE_FILE}: {type(exc).__name__}: {exc}") from exc
    state.update({key: load_plain(file) for key, file in files.items()})
    check_rng_state(state["rng"], rng_file)
    check_scheduler_state(state["scheduler"], files["scheduler"])
    if "optimizer" in state:
        shapes = saved_tensor_shapes(path / "model") if check_against_model else None
        check_optimizer_state(state["optimizer"], files["optimizer"], shapes,
                              exact=(path / "model" / ADAPTER_FILE).is_file())
    return state


@contextmanager
def restoring(file: Path) -> Iterator[None]:
    """Applying a state read from `file` (the optimizer's, the scheduler's, the RNGs', the sampler's): whatever a
    state of another shape raises deep in torch (KeyError 'lr_lambdas', "different number of parameter groups",
    a TypeError) becomes one line naming the file."""
    try:
        yield
    except Exception as exc:
        raise CheckpointError(f"cannot resume from {file}: it does not hold the state this run saves there "
                              f"({type(exc).__name__}: {' '.join(str(exc).split())[:160]}); resume from another "
                              f"checkpoint") from None


def saved_config(path: Path) -> str:
    """The config.yaml text a checkpoint was saved with (its manifest guarantees it is there)."""
    return read_bounded_bytes(path / CONFIG_FILE, MAX_CONFIG_BYTES, "a saved config").decode(errors="replace")


def model_dir(path: Optional[Path]) -> Optional[str]:
    return None if path is None else str(path / "model")
