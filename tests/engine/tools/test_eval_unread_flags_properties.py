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
