"""Every command's argument parser, as its `main` builds it: `grpo-engine` and each of its subcommands, and every
`python -m` command of the benchmarks and the engine's tools (found by what its `main` builds, so a new one is
covered without being listed)."""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
from pathlib import Path

import benchmarks
import grpo_engine.tools


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__()
        self.parser = parser


def command_modules() -> list[str]:
    found = []
    for package in (benchmarks, grpo_engine.tools):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.endswith("conftest"):
                continue
            source = Path(importlib.util.find_spec(info.name).origin).read_text()
            if "def main(" in source and "Parser(" in source:
                found.append(info.name)
    return found


def captured_parser(module_name: str) -> argparse.ArgumentParser:
    """The parser `main` builds, caught as it starts parsing (nothing of the command runs)."""
    main = importlib.import_module(module_name).main
    original = argparse.ArgumentParser.parse_known_args

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    argparse.ArgumentParser.parse_known_args = capture
    try:
        main([]) if inspect.signature(main).parameters else main()
    except _Captured as caught:
        return caught.parser
    finally:
        argparse.ArgumentParser.parse_known_args = original
    raise AssertionError(f"{module_name}.main parsed no arguments")


def engine_subcommands() -> dict[str, argparse.ArgumentParser]:
    """{"train": its parser, ...}: `grpo-engine`'s subcommands."""
    from grpo_engine.cli import build_parser

    return next(action.choices for action in build_parser()._actions
                if isinstance(action, argparse._SubParsersAction))
