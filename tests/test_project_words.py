"""The project's own words name only what exists: every flag a command line in the docs, the examples or a message
gives its command is one of that command's; every config flag and key they name is one of the schema's (or one the
schema says where it lives); every module, Python name and repository path they name exists; every docs section a
reference names is a heading of that file (tests/support/project_words.py reads them). A rename that leaves a word
behind fails here, naming where. Before, docs/benchmarks.md sent readers to `grpo_kernels.api.BACKENDS`, which is
no name, and docs/engine.md said TRL's `loss.sapo_temperature_pos` is refused naming its loss.params entry while
the flag was told "did you mean --rollout.temperature?" (tests/engine/test_cli_moved_flag_properties.py)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings, strategies as st

from grpo_engine.config import leaf_keys
from grpo_engine.config.flags import home_of
import project_words as words

CODE = words.project_code_texts()
PARSERS = words.all_parsers()
KEYS = set(leaf_keys())
TREE = KEYS | {key.rsplit(".", i)[0] for key in KEYS for i in (1, 2) if key.count(".") >= i}

# Names shaped like a config key that are not one: a model's Python attributes, and the misspelt keys the docs and
# messages show as what gets refused. (A file name, model.safetensors or run.py, is told by its suffix.)
NOT_KEYS = {"model.forward", "model.save_pretrained", "model.to_empty", "model.lm_head.weight",
            "run.max_stepz", "run.max_step", "optim.learning_rat", "run.colour"}
FILE_SUFFIXES = (".py", ".json", ".jsonl", ".md", ".yaml", ".safetensors", ".tgz", ".png", ".pt", ".txt")
_KEY = re.compile(rf"(?<![\w./-])(?:--)?((?:{'|'.join(words.SECTIONS)})\.[a-z_][\w.]*[a-z0-9_])(?![\w(])")


def unknown_keys(texts) -> list[str]:
    """'where: key' for each `section.key` or `--section.key` named that the schema neither holds nor places."""
    wrong = []
    for where, text in texts:
        for key in _KEY.findall(text):
            if key not in TREE and key not in NOT_KEYS and not key.endswith(FILE_SUFFIXES) and home_of(key) is None:
                wrong.append(f"{where}: {key}")
    return wrong


def test_every_flag_a_shown_command_line_gives_is_that_commands():
    assert {"grpo-engine train", "python -m benchmarks.gpu_plan", "python -m grpo_engine.tools.demo_seeds"} <= \
        set(PARSERS)
    lines = list(words.command_lines(CODE))
    assert len(lines) > 200 and sum(len(flags) for _, _, flags in lines) > 150  # the reader finds them
    assert words.unknown_flags(CODE, PARSERS) == []


def test_every_config_key_named_is_one():
    assert unknown_keys(CODE) == []


def test_every_python_name_and_repository_path_named_exists():
    assert words.missing_names(CODE) == []


def test_every_docs_section_named_is_a_heading():
    assert words.missing_sections(words.project_texts()) == []


KEY_OR_FLAG = st.sampled_from(sorted(KEYS)).flatmap(lambda key: st.sampled_from([key, f"--{key}"]))


@settings(max_examples=60, deadline=None)
@given(key=KEY_OR_FLAG, renamed=st.from_regex(r"[a-z][a-z_]{2,12}", fullmatch=True),
       command=st.sampled_from(["train", "eval"]))
def test_a_renamed_key_left_in_words_is_named(key, renamed, command):
    """The checks find what they are for: a key or flag renamed in the schema but left in a message, a doc's code or
    a command line (each as it is written there) is reported, with where."""
    stale = key.rsplit(".", 1)[0] + "." + renamed
    name = stale.lstrip("-")
    if name in TREE or name in NOT_KEYS or name.endswith(FILE_SUFFIXES) or home_of(name) is not None:
        return
    flag = stale if stale.startswith("--") else f"--{stale}"
    assert unknown_keys([("msg.py:1", f"invalid value: set {stale} 3 and retry")]) == [f"msg.py:1: {name}"]
    shown = [("docs/x.md", f"grpo-engine {command} --config c.yaml {flag} 3 --run.seed 1 | tail")]
    assert words.unknown_flags(shown, PARSERS) == [f"docs/x.md: grpo-engine {command} {flag}"]


@pytest.mark.parametrize("text, reported", [
    ("the backends: `grpo_kernels.api.BACKENDS`", "grpo_kernels.api.BACKENDS"),
    ("see grpo_engine/config/schemas.py", "grpo_engine/config/schemas.py"),
    ("run `python -m benchmarks.no_such_tool --x`", "benchmarks.no_such_tool"),  # and the command, below
    ('docs/engine.md ("What the engine promises")', "docs/engine.md 'What the engine promises'"),
    ('as before (see "Checkpoints and resumes")', "README.md 'Checkpoints and resumes'"),
    ("[the demo](docs/engine.md#the-built-in-demos)", "docs/engine.md#the-built-in-demos"),
    ("`python -m benchmarks.gpu_plan --memory-gb 80`", "python -m benchmarks.gpu_plan --memory-gb"),
])
def test_a_name_that_does_not_exist_is_named(text, reported):
    texts = [("README.md", text)]
    found = words.missing_names(texts) + words.missing_sections(texts) + words.unknown_flags(texts, PARSERS)
    commands = [f"README.md: python -m {reported}"] if reported.startswith("benchmarks.") else []
    assert found == [f"README.md: {reported}", *commands]
