"""The processes of a launched run start from the same things, checked once, with one all-gather, before any work.

A multi-node launch reads each host's own config file, flags, model directory, data file, reward module and
packages. Where the hosts' copies differed, the run trained on inconsistent state without a word (DDP averaging the
gradients of different objectives: another learning rate, loss, seed or dataset per process), or waited in a
collective for run.distributed_timeout_s (another max_steps or save_steps). Each process now builds a fingerprint of
what must agree and the first difference stops every process with one line naming it and each process's value.
"""

from __future__ import annotations

import hashlib
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from .config import ConfigError, EngineConfig
from .lost_process import outlast_the_launchers_stop
from .state import checkpoint as ckpt
from .state.run_lock import LOCK_FILE
from .steps.rewards import NamedReward, code_fingerprint

# Settings that may rightly differ between processes: a host's CPU count, and who draws the (main process's) bar.
PER_PROCESS_SETTINGS = frozenset({"run.num_threads", "run.progress_bar"})
# The packages whose versions shape the computation; another version on one host computes something else.
PACKAGES = ("torch", "transformers", "accelerate", "triton", "peft", "grpo-kernels")
# The run directory's item: process 0 and every other must read and write one directory.
RUN_DIRECTORY = ("run directory (run.output_dir: one directory every process reaches, on a filesystem the hosts share; "
                 "a relative path is read from each process's working directory)")
_ENDS = 1 << 20  # bytes read at each end of a model file: a safetensors header and the first and last weights


def flat_settings(config: EngineConfig) -> dict[str, Any]:
    """The resolved config as dotted keys (nested sections flattened), less PER_PROCESS_SETTINGS."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        elif prefix not in PER_PROCESS_SETTINGS:
            flat[prefix] = value

    walk("", config.model_dump(mode="json"))
    return flat


def file_digest(path: Path) -> str:
    """The size and a SHA-256 of the first and last MiB: cheap for weights of any size, and different for another
    initialisation, training state or shape (a safetensors file starts with its tensors' names and shapes)."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with path.open("rb") as f:
        digest.update(f.read(_ENDS))
        if size > 2 * _ENDS:
            f.seek(size - _ENDS)
        digest.update(f.read(_ENDS))
    return f"{size} bytes, sha256 of its ends {digest.hexdigest()[:12]}"


def package_version(name: str) -> Optional[str]:
    """The version of an imported package as it reports itself, else as installed; None when not installed."""
    module = sys.modules.get(name.replace("-", "_"))
    version = getattr(module, "__version__", None)
    if version is not None:
        return str(version)
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def launch_fingerprint(config: EngineConfig, model_dir: Optional[str], data: Mapping[str, Mapping[str, Any]],
                       resume: Optional[str], rewards: Sequence[NamedReward] = (),
                       run_dir: Optional[Path] = None) -> dict[str, str]:
    """What must agree, by the name a message gives it, in the order a difference is reported: settings, data,
    reward code, model files, run directory, resume point, packages. `model_dir`: the model's local directory (None:
    built in); `data`: the rows' fingerprints of run_setup ("train", "eval"); `resume`: resume_label's; `rewards`:
    the loaded reward functions, whose user code is compared by its files' names and contents; `run_dir`: the run
    directory, which process 0 holds (run_lock) before the processes join."""
    items = {f"setting {key}": repr(value) for key, value in flat_settings(config).items()}
    for part in ("train", "eval"):
        if part in data:
            items[f"{part} data"] = f"{data[part]['rows']} rows, sha256 {data[part]['sha256'][:12]}"
    code = code_fingerprint(list(rewards), paths=False)
    if code is not None:
        items["reward code"] = f"{code['source']}, sha256 {code['sha256'][:12]}"
    if model_dir is not None and Path(model_dir).is_dir():
        # top level only: a model directory is flat (a Hub snapshot too); the names are relative, so two hosts'
        # caches at different paths agree
        for file in sorted(p for p in Path(model_dir).iterdir() if p.is_file() and not p.name.startswith(".")):
            items[f"model file {file.name}"] = file_digest(file)
    if run_dir is not None:
        items[RUN_DIRECTORY] = run_directory_label(run_dir)
    items["resume point"] = resume or "none (a fresh start)"
    items["python"] = sys.version.split()[0]
    for package in PACKAGES:
        items[f"package {package}"] = package_version(package) or "not installed"
    return items


def run_directory_label(run_dir: Path) -> str:
    """The run directory as this process sees it: whom its lock file names. Process 0 wrote its own pid, host and
    start time there before the processes joined, so a process that sees anything else reaches another directory:
    a relative run.output_dir read from another working directory, or a path on each host's own disk. Before, such a
    run went on until a process missed a file another had written (the demo's base_model/, a checkpoint)."""
    try:
        with (run_dir / LOCK_FILE).open("rb") as lock:
            holder = lock.read(4096).decode(errors="replace").strip()
    except FileNotFoundError:
        return "no such directory" if not run_dir.is_dir() else "a directory no run holds"
    except OSError as exc:
        return f"an unreadable directory ({exc.strerror or exc})"
    return f"a directory held by {holder}" if holder else "a directory no run holds"


def resume_label(resume: Optional[str], run_dir: Path) -> str:
    """The checkpoint this process would resume from, as the fingerprint shows it. Resolved before the resume's own
    checks (which then refuse alike on every process), so that one process starting fresh where another resumes, or
    "latest" naming another checkpoint in each host's run directory, is the one line of a disagreement, not one
    process's own refusal and a lost process on the others."""
    if not resume:
        return "none (a fresh start)"
    try:
        point = ckpt.resolve_resume(resume, run_dir)
    except (ckpt.CheckpointError, OSError):  # said by the resume's own check when every process has none
        return "none usable"
    return f"{point.path.name} (step {point.step})"


def first_disagreement(fingerprints: Sequence[Mapping[str, str]]) -> Optional[str]:
    """One line naming the first item (in process 0's order, then the others') whose value is not the same on every
    process, with each value and the processes that have it; None when all agree."""
    names = list(dict.fromkeys(name for fingerprint in fingerprints for name in fingerprint))
    for name in names:
        values = [fingerprint.get(name, "(not there)") for fingerprint in fingerprints]
        if len(set(values)) == 1:
            continue
        holders: dict[str, list[int]] = {}
        for rank, value in enumerate(values):
            holders.setdefault(value, []).append(rank)
        texts = [_short(value) for value in holders]
        if len(set(texts)) < len(texts):  # values apart only in spacing or past the cut: each whole, as a literal
            texts = [repr(value) for value in holders]
        shown = "; ".join(f"process{'es' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
                          f"{'have' if len(ranks) > 1 else 'has'} {text}" for text, ranks in zip(texts, holders.values()))
        return (f"the processes of this launch disagree on {name}: {shown}; every process must start from the same "
                f"flags, config file, model, data, reward code, checkpoint and packages (a multi-node launch reads "
                f"each host's own copies)")
    return None


def _short(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= 80 else f"{flat[:77]}..."


def check_processes_agree(fingerprint: dict[str, str]) -> None:
    """ConfigError, on every process, when the fingerprints gathered from all processes differ (one all-gather; call
    it on every process of a joined group, before any work)."""
    import torch

    gathered: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, fingerprint)
    message = first_disagreement(gathered)
    if message is not None:
        # every process stops at once: torchrun's SIGTERM to the others, sent when the first one exits, ended a
        # slower one before its line was out
        outlast_the_launchers_stop()
        raise ConfigError(message)
