"""The engine's messages go through `logging` (grpo_engine/messages.py): `grpo-engine` shows them as they always read
(the text alone; warnings on stderr, notes on stdout), an embedding program captures them as any library's log,
and no engine module but the commands' output prints."""

import ast
import logging

from repo_paths import ROOT

from grpo_engine.messages import show_messages
from grpo_engine.state import metrics

# The modules whose job is printing a command's output (a report, a table, the finished run's summary).
COMMAND_OUTPUT = {"grpo_engine/cli.py", "grpo_engine/command_failure.py", "grpo_engine/tools/bench.py",
                  "grpo_engine/tools/demo_seeds.py",
                  "grpo_engine/tools/overlap_bench.py", "grpo_engine/tools/packing_bench.py", "grpo_engine/tools/parallel_memory.py",
                  "grpo_engine/tools/reference_docs.py", "grpo_engine/tools/rollout_speed.py", "grpo_engine/tools/serve.py"}


def test_shown_as_the_cli_shows_them(capsys):
    show_messages()
    show_messages()  # once: no second handler, no line twice
    logging.getLogger("grpo_engine.some_module").info("resuming from x at step 2 of 4")
    logging.getLogger("grpo_engine.some_module").warning("warning: something to know")
    logging.getLogger("grpo_engine.some_module").debug("not shown")
    captured = capsys.readouterr()
    assert captured.out == "resuming from x at step 2 of 4\n"
    assert captured.err == "warning: something to know\n"


def test_an_embedding_program_captures_them(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo')
    with caplog.at_level(logging.WARNING, logger="grpo_engine"):
        rows = metrics.jsonl_rows(path)
    assert [row["step"] for row, _ in rows] == [1]
    assert [(r.name, r.levelno) for r in caplog.records] == [("grpo_engine.state.metrics", logging.WARNING)]
    assert "was cut off mid-write" in caplog.records[0].getMessage()


def test_no_engine_module_prints_but_the_commands_output():
    printing = []
    for path in sorted((ROOT / "grpo_engine").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(), filename=relative)
        printing += [f"{relative}:{node.lineno}" for node in ast.walk(tree) if isinstance(node, ast.Call)
                     and isinstance(node.func, ast.Name) and node.func.id == "print" and relative not in COMMAND_OUTPUT]
    assert printing == [], "report through logging.getLogger(__name__) (grpo_engine/messages.py), not print"
