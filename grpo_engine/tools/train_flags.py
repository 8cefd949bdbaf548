"""The `grpo-engine train` flags a tool passes on to the runs it starts (`demo_seeds -- --run.max_steps 200`),
checked as `grpo-engine train` checks them, before the tool's first run.

A misspelt or out-of-range flag was found by the first training process, after the tool had imported torch: its
refusal went to that run's log and the tool ended in a traceback ("... failed (exit 2); see seed-0.log").
"""

from __future__ import annotations

from typing import Sequence

from ..cli import build_parser, train_config, unknown_arguments_message, join_flag_values
from ..config import ConfigError


def check_train_flags(flags: Sequence[str], given_by_the_tool: Sequence[str] = ()) -> None:
    """ConfigError in one line naming the first of `flags` that `grpo-engine train` would refuse (unknown, a value it
    does not take, a config it does not load); `given_by_the_tool`: the flags the tool itself adds, checked with
    them."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(join_flag_values(["train", *given_by_the_tool, *flags], parser))
    if unknown:
        raise ConfigError(f"the flags for grpo-engine train: {unknown_arguments_message(parser, 'train', unknown)}")
    try:
        train_config(args)
    except ConfigError as exc:
        raise ConfigError(f"the flags for grpo-engine train: {exc}") from None
