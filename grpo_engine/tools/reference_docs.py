"""The reference tables of the docs, generated from what defines them: the engine's settings from its schema (every
key `grpo-engine train --help` lists), the commands' synopsis from the CLI's parser, and the loss backends with
what each declares from the registry.

    python -m grpo_engine.tools.reference_docs     # rewrite the generated blocks of README.md and docs/engine.md
    python -m grpo_engine.tools.reference_docs --check  # exit 1 naming each block that differs (the tests run this)

Each block sits between `<!-- NAME:begin ... -->` and `<!-- NAME:end -->` markers; the text around it is prose.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..cli_parser import CommandParser, doc_summary
from ..command_failure import run_tool
from ..state.atomic_file import write_atomically

ROOT = Path(__file__).resolve().parents[2]
COMMAND = "python -m grpo_engine.tools.reference_docs"


# ---- the blocks -----------------------------------------------------------------------------------------------

def _cell(text: Any) -> str:
    """Text for one markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def settings_table(fields: Optional[dict] = None) -> str:
    """| key | default | meaning | for every dotted leaf key of the schema, in the schema's order. `fields`: {key:
    pydantic FieldInfo} (default: the engine's schema, as the CLI reads it)."""
    if fields is None:
        from ..config.flags import leaf_fields

        fields = leaf_fields()
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    for key, field in fields.items():
        default = field.get_default(call_default_factory=True)
        lines.append(f"| `{key}` | `{_cell(_shown(default))}` | {_cell(field.description or '')} |")
    return "\n".join(lines)


def _option_usage(action: argparse.Action) -> str:
    if action.option_strings:
        name = max(action.option_strings, key=len)
        if action.nargs == 0:
            text = name
        else:
            metavar = action.metavar or (("{" + ",".join(map(str, action.choices)) + "}") if action.choices
                                         else action.dest.upper())
            value = {"?": f"[{metavar}]", "+": f"{metavar} [{metavar} ...]", "*": f"[{metavar} ...]"}.get(
                action.nargs, metavar)
            text = f"{name} {value}"
        return text if action.required else f"[{text}]"
    return action.metavar or action.dest.upper()


def _wrapped(head: str, parts: Sequence[str], width: int = 116) -> list[str]:
    lines, line = [], head
    for part in parts:
        if len(line) + 1 + len(part) > width and line.strip():
            lines.append(line)
            line = " " * (len(head) - 1)
        line += " " + part
    return lines + [line]


def command_synopsis(parser: Optional[argparse.ArgumentParser] = None) -> str:
    """Each command of `grpo-engine` and its options as the parser declares them (the per-key config flags as
    one `[--SECTION.KEY VALUE ...]`), in a bash block."""
    if parser is None:
        from ..cli import build_parser

        parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    lines = ["```bash"]
    width = max(len(name) for name in commands.choices)
    for name, command in commands.choices.items():
        parts, keys = [], False
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if action.dest.startswith("cfg:"):
                keys = True
                continue
            parts.append(_option_usage(action))
        if keys:
            parts.append("[--SECTION.KEY VALUE ...]")
        lines += _wrapped(f"{parser.prog} {name.ljust(width)}", parts)
    return "\n".join(lines + ["```"])


# What each declared capability is called in the table: the BackendSpec field -> its column.
_CAPABILITIES = {"auto": "auto picks it", "uses_workspace": "workspace", "kept_token_sets": "kept-token sets",
                 "vocab_shards": "vocabulary shards", "logit_transforms": "logit transforms",
                 "batch_invariant": "batch-invariant", "deterministic": "bitwise repeatable",
                 "torch_compile": "torch.compile", "second_order": "second order",
                 "materializes_logits": "materializes logits"}


def backends_table(specs: Optional[dict] = None) -> str:
    """| backend | what it is | each declared capability | token-level route | dtypes | for every registered
    backend (`specs`: name -> BackendSpec; default: the registry)."""
    if specs is None:
        from grpo_kernels.backends import BACKENDS

        specs = BACKENDS
    header = ["backend", "what it is", *_CAPABILITIES.values(), "token-level route", "dtypes"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, spec in specs.items():
        flags = ["yes" if getattr(spec, field) else "no" for field in _CAPABILITIES]
        route = spec.token_level_route.name if spec.token_level_route is not None else "two-step"
        lines.append(f"| `{name}` | {_cell(spec.summary)} | " + " | ".join(flags) + f" | {route} | "
                     f"{', '.join(spec.dtypes)} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Block:
    name: str
    path: str  # relative to the repository root
    make: Callable[[], str]


BLOCKS = (Block("settings", "docs/engine.md", settings_table),
          Block("commands", "docs/engine.md", command_synopsis),
          Block("backends", "README.md", backends_table))


# ---- reading and writing them ---------------------------------------------------------------------------------

def _span(text: str, name: str, path: str) -> tuple[int, int]:
    """(start of the line after the begin marker, start of the end marker)."""
    begin, end = text.find(f"<!-- {name}:begin"), text.find(f"<!-- {name}:end -->")
    if begin < 0 or end < begin:
        raise ValueError(f"{path} has no <!-- {name}:begin --> ... <!-- {name}:end --> markers")
    return text.index("\n", begin) + 1, end


def render(text: str, block: Block, content: str) -> str:
    start, end = _span(text, block.name, block.path)
    marker = f"<!-- {block.name}:begin - generated by `{COMMAND}`; do not edit -->\n"
    return text[:text.rfind("\n", 0, start - 1) + 1] + marker + content + "\n" + text[end:]


def stale_blocks(root: Path = ROOT, blocks: Sequence[Block] = BLOCKS) -> list[str]:
    """The blocks whose text differs from what the code defines now, as 'path: name'."""
    stale = []
    for block in blocks:
        text = (root / block.path).read_text()
        if render(text, block, block.make()) != text:
            stale.append(f"{block.path}: {block.name}")
    return stale


def update(root: Path = ROOT, blocks: Sequence[Block] = BLOCKS) -> list[str]:
    """Rewrite every stale block; the ones rewritten."""
    changed = stale_blocks(root, blocks)
    for block in blocks:
        path = root / block.path
        write_atomically(path, render(path.read_text(), block, block.make()))  # stopped midway, the doc stays whole
    return changed


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = CommandParser(prog=COMMAND, description=doc_summary(__doc__))
    parser.add_argument("--check", action="store_true", help="only say which blocks are stale (exit 1 if any)")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_blocks()
        for name in stale:
            print(f"stale: {name} (run {COMMAND})", file=sys.stderr)
        return 1 if stale else 0
    for name in update():
        print(f"rewrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(main, "python -m grpo_engine.tools.reference_docs"))
