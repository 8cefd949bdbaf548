"""The docs' reference tables are what the code defines: every settings key `grpo-engine train --help` lists, every
command and option of the parser, every registered backend and what it declares (grpo_engine/tools/reference_docs.py);
the generator reads them generically, so a key, a command or a backend added anywhere shows up, and a doc left
behind fails here."""

import argparse
import re

import pytest
from pydantic import BaseModel, Field
from repo_paths import ROOT

from grpo_engine.tools import reference_docs
from grpo_kernels.backends import BACKENDS, BackendSpec


def test_the_generated_blocks_are_current():
    assert reference_docs.stale_blocks() == [], f"run {reference_docs.COMMAND}"


def _train_help_keys() -> set[str]:
    from grpo_engine.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest[4:] for a in commands.choices["train"]._actions if a.dest.startswith("cfg:")}


def test_the_settings_table_lists_every_key_train_help_lists():
    text = (ROOT / "docs/engine.md").read_text()
    block = text[text.index("<!-- settings:begin"):text.index("<!-- settings:end")]
    keys = re.findall(r"^\| `([^`]+)` \|", block, flags=re.MULTILINE)
    assert len(keys) == len(set(keys)) and set(keys) == _train_help_keys()


def test_a_new_field_shows_up_with_its_default_and_description():
    class Section(BaseModel):
        size: int = Field(3, description="how many | at most")

    class Tree(BaseModel):
        section: Section = Section()

    from grpo_engine.config.flags import leaf_fields

    assert reference_docs.settings_table(leaf_fields(Tree)).splitlines()[2] == \
        "| `section.size` | `3` | how many \\| at most |"


def test_a_new_command_and_a_new_backend_show_up():
    parser = argparse.ArgumentParser(prog="tool")
    sub = parser.add_subparsers()
    run = sub.add_parser("run")
    run.add_argument("target")
    run.add_argument("--fast", action="store_true")
    run.add_argument("--level", choices=[1, 2], required=True)
    assert reference_docs.command_synopsis(parser).splitlines()[1] == "tool run TARGET [--fast] --level {1,2}"
    spec = BackendSpec("new_one", ".torch_streaming", "a new backend", batch_invariant=True)
    rows = reference_docs.backends_table({**BACKENDS, "new_one": spec}).splitlines()
    assert rows[-1].startswith("| `new_one` | a new backend | no | no | yes | yes | yes | yes | yes |")
    assert len(rows) == 2 + len(BACKENDS) + 1


def test_a_stale_block_is_named(tmp_path):
    (tmp_path / "doc.md").write_text("prose\n<!-- numbers:begin -->\nold\n<!-- numbers:end -->\nmore prose\n")
    block = reference_docs.Block("numbers", "doc.md", lambda: "1 2 3")
    assert reference_docs.stale_blocks(tmp_path, [block]) == ["doc.md: numbers"]
    assert reference_docs.update(tmp_path, [block]) == ["doc.md: numbers"]
    assert reference_docs.stale_blocks(tmp_path, [block]) == []
    assert (tmp_path / "doc.md").read_text().endswith("1 2 3\n<!-- numbers:end -->\nmore prose\n")
    with pytest.raises(ValueError, match="no <!-- other:begin -->"):
        reference_docs.stale_blocks(tmp_path, [reference_docs.Block("other", "doc.md", str)])


def test_the_prose_backend_table_names_every_registered_backend():
    readme = (ROOT / "README.md").read_text()
    prose = readme[readme.index("| backend | what it is | extra memory"):readme.index("<!-- backends:begin")]
    assert set(re.findall(r'^\| `"([a-z_]+)"`', prose, flags=re.MULTILINE)) == set(BACKENDS)
