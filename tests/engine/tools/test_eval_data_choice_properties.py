"""`grpo-engine eval` scores the evaluation data: `--data` when given, else data.eval_path (what training evaluates),
else data.path, else the built-in task; `--data` with `--data.eval_path` is one line. Before, a training config
holding both data.path and data.eval_path had its training data scored, and the training-set accuracy printed as the
evaluation's without a word."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import main
from grpo_engine.tools import evaluate

BUILTIN_PROBLEMS = 36  # the demo preset's operands 0..5


class Scored(Exception):
    pass


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Four data files told apart by their number of rows."""
    root = tmp_path_factory.mktemp("eval_data")
    paths = {}
    for name, rows in (("yaml_path", 2), ("yaml_eval", 3), ("flag_data", 4), ("flag_eval", 5)):
        paths[name] = root / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n"
                                       for i in range(rows)))
    return root, paths


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(given_=st.sets(st.sampled_from(["yaml_path", "yaml_eval", "flag_data", "flag_eval"])))
def test_eval_scores_the_evaluation_data(given_, files, tiny_model_dir, monkeypatch, capsys):
    root, paths = files
    scored: list[int] = []

    def rendered(rows, *args, **kwargs):  # the rows eval loaded: stop before the model
        scored.append(len(rows))
        raise Scored

    monkeypatch.setattr(evaluate, "render_prompts", rendered)
    yaml = root / "config.yaml"
    data = {key: str(paths[name]) for name, key in (("yaml_path", "path"), ("yaml_eval", "eval_path"))
            if name in given_}
    yaml.write_text(json.dumps({"data": data}))
    argv = ["eval", "--model", str(tiny_model_dir), "--config", str(yaml)]
    if "flag_data" in given_:
        argv += ["--data", str(paths["flag_data"])]
    if "flag_eval" in given_:
        argv += ["--data.eval_path", str(paths["flag_eval"])]
    capsys.readouterr()
    try:
        outcome = main(argv)
    except Scored:
        outcome = "scored"
    err = capsys.readouterr().err.splitlines()
    if {"flag_data", "flag_eval"} <= given_:
        assert outcome == 2 and len(err) == 1 and "--data" in err[0] and "--data.eval_path" in err[0], err
        return
    assert outcome == "scored", err
    expected = next((name for name in ("flag_data", "flag_eval", "yaml_eval", "yaml_path") if name in given_), None)
    rows = BUILTIN_PROBLEMS if expected is None else {"yaml_path": 2, "yaml_eval": 3, "flag_data": 4,
                                                     "flag_eval": 5}[expected]
    assert scored == [rows], (given_, scored)
