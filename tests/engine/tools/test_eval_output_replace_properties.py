"""`grpo-engine eval --output FILE` writes over no file the user keeps: an existing FILE is replaced only when it is
empty or an earlier evaluation's metrics (a rerun), and anything else there (text, bytes, other JSON, the --config
file itself) is one line naming --output before the evaluation starts, the file left as it was. Before, it was
replaced by the metrics without a word."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, assume, given, settings, strategies as st

from grpo_engine.cli import main
from grpo_engine.tools import evaluate
from grpo_engine.tools.eval_output import is_eval_metrics

METRICS = {"accuracy": 0.25, "num_prompts": 4.0, "pass@1": 0.25}
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                           max_leaves=8)
EARLIER = st.builds(lambda extra, value: json.dumps({**extra, "accuracy": value}, indent=2),
                    st.dictionaries(st.text(max_size=8), st.floats(0, 1), max_size=3), st.floats(0, 1))
OTHER = (st.binary(min_size=1) | st.text(min_size=1).map(str.encode)
         | JSON_VALUES.map(lambda value: json.dumps(value).encode()))


class Evaluated(Exception):
    pass


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["none", "empty", "earlier", "other"]), earlier=EARLIER, other=OTHER)
def test_an_existing_output_is_replaced_only_when_it_is_an_earlier_evaluations(kind, earlier, other, tiny_model_dir,
                                                                               tmp_path_factory, monkeypatch, capsys):
    if kind == "other":
        try:
            assume(not is_eval_metrics(json.loads(other)))
        except (ValueError, RecursionError):
            pass
    output = tmp_path_factory.mktemp("eval_output") / "metrics.json"
    content = {"none": None, "empty": b"", "earlier": earlier.encode(), "other": other}[kind]
    if content is not None:
        output.write_bytes(content)
    evaluated = []
    monkeypatch.setattr(evaluate, "run_eval", lambda *args, **kwargs: evaluated.append(1) or dict(METRICS))
    capsys.readouterr()
    status = main(["eval", "--model", str(tiny_model_dir), "--output", str(output)])
    err = capsys.readouterr().err.splitlines()
    if kind == "other":
        assert status == 1 and not evaluated and len(err) == 1, err
        assert f"--output {str(output)!r} exists and is not an earlier evaluation's metrics" in err[0], err
        assert output.read_bytes() == content
        return
    assert status == 0 and evaluated, err
    assert json.loads(output.read_text()) == METRICS


def test_the_config_file_named_as_output_is_refused(tiny_model_dir, tmp_path, monkeypatch, capsys):
    config = tmp_path / "eval.yaml"
    config.write_text("rollout:\n  max_new_tokens: 4\n")
    monkeypatch.setattr(evaluate, "run_eval", lambda *args, **kwargs: dict(METRICS))
    assert main(["eval", "--model", str(tiny_model_dir), "--config", str(config), "--output", str(config)]) == 1
    assert "is not an earlier evaluation's metrics" in capsys.readouterr().err
    assert config.read_text() == "rollout:\n  max_new_tokens: 4\n"
