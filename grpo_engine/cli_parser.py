"""The argument parser every `grpo-engine` command is built on: one line per argument error, and a flag that
takes one value, given twice with two different values, said in one line naming it and the value used.

argparse's own answer to a missing value (`--run.max_steps` at the end of the line), a value of the wrong type
(`--batch-size abc`) or a missing required option is the whole usage text (for `train`, every config key: about
90 lines) above the one line that says what is wrong; and it keeps the last of a repeated flag without a word,
so `--run.max_steps 3 ... --run.max_steps 5` trained 5 steps whoever meant 3. The last value still wins (a script's
defaults followed by a person's overrides is a common way to call a command), but never silently.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, NoReturn, Optional, Sequence

_log = logging.getLogger(__name__)  # grpo_engine/messages.py: how the CLI shows it

# Where a parse notes the values it has stored (flag -> value): kept on the namespace so that one parser object
# parses many command lines (the tests' module-level parsers do); removed before the namespace is returned.
_GIVEN = "_grpo_engine_values_given"


class StoreSayingRepeats(argparse._StoreAction):
    """argparse's `store` (the last value wins), saying so in one line when the flag was given before with another
    value (the same value again says nothing: it changes nothing)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        given = namespace.__dict__.setdefault(_GIVEN, {})
        if self.dest in given and given[self.dest] != values:
            flag = option_string or self.dest
            _log.warning(f"note: {flag} given twice, {_shown(given[self.dest])} then {_shown(values)}: the last one, "
                         f"{_shown(values)}, is used")
        given[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def doc_summary(doc: Optional[str], first_line: bool = False) -> Optional[str]:
    """A program's --help description: the first paragraph (or line) of its module's docstring. None under
    `python -OO`, which strips docstrings: reading `__doc__.split(...)` there ended every program, --help included,
    in an AttributeError traceback before it parsed anything."""
    if not doc:
        return None
    return doc.splitlines()[0] if first_line else doc.split("\n\n")[0]


class CommandLineError(SystemExit):
    """An argument error, already said in one line on stderr: exit status 2, as argparse's. `grpo_engine.cli.main`
    returns that status rather than ending the process, as it does for every other error."""

    def __init__(self) -> None:
        super().__init__(2)


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line naming the argument, and whose single-value flags say
    when a second, different value replaces the first. Subcommands made with add_subparsers().add_parser are of this class too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # a misspelt flag must fail, not match the flag it abbreviates
        super().__init__(*args, **kwargs)
        self.register("action", None, StoreSayingRepeats)  # the action of every add_argument without action=
        self.register("action", "store", StoreSayingRepeats)

    def error(self, message: str) -> NoReturn:
        text = " ".join(message.split())
        # argparse's own way to stderr (the command's output, as its usage text was), without the usage text
        self._print_message(f"{self.prog}: {text} ({self.prog} --help lists every argument)\n", sys.stderr)
        raise CommandLineError()

    def parse_known_args(self, args: Optional[Sequence[str]] = None,
                         namespace: Optional[argparse.Namespace] = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, unknown = super().parse_known_args(args, namespace)
        parsed.__dict__.pop(_GIVEN, None)
        return parsed, unknown
