"""The project's own words that name something a user then types or opens: the code in README.md, docs/*.md and
examples/ (code spans and code blocks), and every string literal of grpo_engine/, grpo_kernels/ and benchmarks/
(messages, help texts, docstrings; an f-string's fixed parts, its fields as {}). And what each kind of name must
match: a command's flags its parser, a config key the schema, a module or Python name an import, a repository path
a file, a docs section a heading."""

from __future__ import annotations

import argparse
import ast
import importlib
import re
from pathlib import Path
from typing import Iterable, Iterator, Optional

from repo_paths import ROOT

Text = tuple[str, str]  # (where: "docs/engine.md" or "grpo_engine/cli.py:12", the text)

PACKAGES = ("grpo_engine", "grpo_kernels", "benchmarks")
SECTIONS = ("model", "data", "rollout", "rewards", "loss", "optim", "run")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _code_of_markdown(text: str) -> list[str]:
    """Its fenced code blocks and its code spans (a span may wrap onto the next line)."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return blocks + [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]


def string_literals(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def project_code_texts() -> list[Text]:
    texts = [(path.relative_to(ROOT).as_posix(), code) for path in markdown_files()
             for code in _code_of_markdown(path.read_text())]
    texts += [(path.relative_to(ROOT).as_posix(), path.read_text())
              for path in sorted((ROOT / "examples").rglob("*")) if path.is_file() and path.suffix != ".jsonl"]
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            texts += [(f"{where}:{line}", text) for line, text in string_literals(path)]
    return texts


def project_texts() -> list[Text]:
    """The Markdown files whole (their links and section names are in the prose), the examples, and the code's
    string literals."""
    texts = [(path.relative_to(ROOT).as_posix(), path.read_text()) for path in markdown_files()]
    return texts + [text for text in project_code_texts() if not text[0].endswith(".md")]


# A command line: `grpo-engine SUBCOMMAND ...` or `python -m MODULE ...`, up to where a shell line or a sentence
# ends it (a pipe, `;`, `&&`, a comment, a closing parenthesis, ": " or ", " of the prose around it). A backslash
# at a line's end continues it; after ` -- ` the arguments are another program's (serve passes them to vLLM).
_COMMAND = re.compile(r"(?<![\w./-])(grpo-engine [a-z]+|python3? -m [\w.]+)((?:[^\n|;&#)`,:]|\\\n|:(?! )|,(?! )"
                      r"|&(?!&))*)")
_FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w.-]*[A-Za-z0-9_]")


def command_lines(texts: Iterable[Text]) -> Iterator[tuple[str, str, list[str]]]:
    """(where, command, the flags its line gives it) for every command line named in `texts`."""
    for where, text in texts:
        for match in _COMMAND.finditer(text):
            command = match.group(1).replace("python3 ", "python ")
            arguments = re.split(r"(?:^|\s)--(?:\s|$)", match.group(2), maxsplit=1)[0]
            yield where, command, _FLAG.findall(arguments)


def all_parsers() -> dict[str, argparse.ArgumentParser]:
    """{"grpo-engine train": parser, "python -m benchmarks.gpu_plan": parser, ...}: each command by the line that
    runs it (a thin module that runs another's main is named by that main's prog)."""
    from command_parsers import captured_parser, command_modules, engine_subcommands

    parsers = {f"grpo-engine {name}": parser for name, parser in engine_subcommands().items()}
    for module in command_modules():
        parser = captured_parser(module)
        parsers[f"python -m {module}"] = parser
        parsers.setdefault(parser.prog, parser)
    return parsers


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def unknown_flags(texts: Iterable[Text], parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """'where: command --flag' for each flag a named command line gives a command that has no such flag, and
    'where: command' for a `python -m` module that does not exist (modules of other projects are not looked up)."""
    wrong = []
    for where, command, flags in command_lines(texts):
        if command.startswith("grpo-engine "):
            if command not in parsers:
                continue  # prose: "grpo-engine needs ...", "grpo-engine shows ..."
        elif command.split()[-1].split(".")[0] not in PACKAGES:
            continue
        elif command not in parsers:
            if not module_exists(command.split()[-1].rstrip(".")):
                wrong.append(f"{where}: {command}")
            continue
        wrong += [f"{where}: {command} {flag}" for flag in flags if flag not in options(parsers[command])]
    return wrong


def module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def python_name_exists(dotted: str) -> bool:
    """Whether `dotted` (grpo_kernels.backends.BACKENDS) is a module, or a name reached from one by attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        if module_exists(".".join(parts[:cut])):
            try:
                value = importlib.import_module(".".join(parts[:cut]))
            except ImportError:  # an integration whose package is not installed here (trl): its source defines it
                return cut == len(parts) or parts[cut] in _defined_names(".".join(parts[:cut]))
            for part in parts[cut:]:
                if not hasattr(value, part):
                    return False
                value = getattr(value, part)
            return True
    return False


def _defined_names(module: str) -> set[str]:
    tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text())
    return {target.id for node in tree.body for target in getattr(node, "targets", [])
            if isinstance(target, ast.Name)} | {node.name for node in tree.body if hasattr(node, "name")}


_PYTHON_NAME = re.compile(rf"(?<![\w/.-])((?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+)")
# A path with a placeholder in it (*, <version>, {json,md}) names a pattern: its folder must exist.
_REPO_PATH = re.compile(r"(?<![\w/.-])((?:grpo_engine|grpo_kernels|benchmarks|tests|scripts|examples|docs)/"
                        r"(?:[\w/.*-]|<[\w-]+>|\{[\w,]+\})*(?:[\w*]|<[\w-]+>|\{[\w,]+\}))")


def missing_names(texts: Iterable[Text]) -> list[str]:
    """'where: name' for each Python name or repository path named that does not exist (a pattern: whose folder
    does not)."""
    wrong = []
    for where, text in texts:
        for name in _PYTHON_NAME.findall(text):
            if not python_name_exists(name):
                wrong.append(f"{where}: {name}")
        for path in _REPO_PATH.findall(text):
            pattern = re.search(r"[*<{]", path)
            exists = (ROOT / path[:pattern.start()]).parent.is_dir() if pattern else (ROOT / path).exists()
            if not exists:
                wrong.append(f"{where}: {path}")
    return wrong


def headings(path: Path) -> list[str]:
    return [title.strip() for title in re.findall(r"^#+ (.*)$", path.read_text(), flags=re.MULTILINE)]


def anchor(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


# `docs/engine.md ("What the engine guarantees")`, `docs/math.md, "Advantages"`, a link `[..](file#anchor)`, and
# in a Markdown file `see "Checkpoints and resume"`: a section of that file.
_SECTION_BY_TITLE = re.compile(r"((?:docs/)?[\w-]+\.md)(?:'s)?,? \(?[\"“]([^\"”]+)[\"”]")
_SECTION_HERE = re.compile(r"[Ss]ee (?:also )?[\"“]([^\"”]+)[\"”]")
_SECTION_BY_ANCHOR = re.compile(r"\]\(([^)#\s]*)#([^)\s]+)\)")


def missing_sections(texts: Iterable[Text]) -> list[str]:
    """'where: file "section"' for each docs section named (by its title or a link's anchor) that the file lacks."""
    wrong = []
    for where, text in texts:
        source = ROOT / where.split(":")[0]
        here = [(where, title) for title in _SECTION_HERE.findall(text)] if where.endswith(".md") else []
        for document, title in _SECTION_BY_TITLE.findall(text) + here:
            path = _document(document, source)
            if path is None or not any(title.lower() in heading.lower() for heading in headings(path)):
                wrong.append(f"{where}: {document} {title!r}")
        for document, name in _SECTION_BY_ANCHOR.findall(text):
            path = source if not document else _document(document, source)
            if path is None or name not in {anchor(heading) for heading in headings(path)}:
                wrong.append(f"{where}: {document}#{name}")
    return wrong


def _document(name: str, source: Path) -> Optional[Path]:
    for candidate in (source.parent / name, ROOT / name, ROOT / "docs" / name):
        if candidate.is_file():
            return candidate
    return None
