"""`grpo-engine eval` says each flag of a setting it does not read, in one warning line naming the flag, before the
evaluation: the sampling settings when it decodes greedily, data.split (it scores data.eval_split), the built-in
task's settings when it scores a file, training's settings (optim, loss, the run's, the rollout's backend and group
size). Flags it reads are not named (hypothesis draws the flags and how eval runs). Before, every such flag was
taken and ignored without a word: `--rollout.temperature 0.5` without --sample evaluated greedily."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import main
from grpo_engine.tools import evaluate

# flag -> (value, when eval reads it: "always", "never", "sampling", "builtin" or "file")
FLAGS = {
    "rollout.temperature": ("0.5", "sampling"), "rollout.top_k": ("5", "sampling"), "rollout.top_p": ("0.9", "sampling"),
    "rollout.repetition_penalty": ("1.1", "always"), "rollout.max_new_tokens": ("6", "always"),
    "data.split": ("train", "never"), "data.eval_split": ("validation", "never"),
    "data.builtin_max_operand": ("2", "builtin"), "data.max_prompt_chars": ("1000", "file"),
    "data.prompt_column": ("prompt", "always"), "optim.learning_rate": ("0.1", "never"), "loss.beta": ("0.1", "never"),
    "run.seed": ("3", "always"), "run.max_steps": ("5", "never"), "rollout.num_generations": ("4", "never"),
    "model.lora.enabled": ("true", "never"), "rewards.math_correct": ("2.0", "always"),
    "rewards.scale_rewards": ("none", "never"), "rollout.importance_sampling_cap": ("3.0", "never"),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flags=st.sets(st.sampled_from(sorted(FLAGS)), max_size=6), sampling=st.sampled_from(["no", "--sample", "n2"]),
       data_file=st.booleans())
def test_each_flag_eval_does_not_read_is_named(flags, sampling, data_file, tiny_model_dir, tmp_path_factory,
                                               monkeypatch, capsys):
    monkeypatch.setattr(evaluate, "run_eval", lambda *args, **kwargs: {"accuracy": 0.0, "num_prompts": 1.0})
    argv = ["eval", "--model", str(tiny_model_dir)]
    for flag in sorted(flags):
        argv += [f"--{flag}", FLAGS[flag][0]]
    argv += {"no": [], "--sample": ["--sample"], "n2": ["--num-samples", "2"]}[sampling]
    if data_file:
        path = tmp_path_factory.mktemp("data") / "d.jsonl"
        path.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
        argv += ["--data", str(path)]
    capsys.readouterr()
    assert main(argv) == 0
    said = {line.split()[1].removeprefix("--") for line in capsys.readouterr().err.splitlines()
            if "changes nothing in an evaluation" in line}
    read_when = {"always": True, "never": False, "sampling": sampling != "no", "builtin": not data_file,
                 "file": data_file}
    assert said == {flag for flag in flags if not read_when[FLAGS[flag][1]]}, (argv, said)


def test_every_setting_is_placed_read_or_never_read_by_eval():
    """Each leaf key of the schema is either read by eval (READ_BY_EVAL) or never, with a reason
    (NEVER_READ_BY_EVAL), not both: a setting added to the schema fails here until placed. Before, keys eval ignores
    (`--rewards.weights`, `--rewards.scale_rewards`, `--rollout.importance_sampling_cap`) fell between the two lists
    and were taken without a word."""
    from grpo_engine.config import EngineConfig
    from grpo_engine.config.applicability import declared_conditions
    from grpo_engine.tools.eval_settings import NEVER_READ_BY_EVAL, READ_BY_EVAL, never_read_reason

    keys = [key for key, _ in declared_conditions(EngineConfig)]
    unplaced = [key for key in keys if key not in READ_BY_EVAL and never_read_reason(key) is None]
    assert unplaced == [], f"neither read by eval nor given a reason: {unplaced}"
    assert READ_BY_EVAL <= set(keys), f"not settings of the schema: {sorted(READ_BY_EVAL - set(keys))}"
    assert not READ_BY_EVAL & set(NEVER_READ_BY_EVAL), "read and never read"
