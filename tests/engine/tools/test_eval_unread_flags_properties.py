"""`grpo-engine eval` says each flag of a setting it does not read, in one warning line naming the flag, before the
evaluation: the sampling settings when it decodes greedily, data.split (it scores data.eval_split), the built-in
task's settings when it scores a file, training's settings (optim, loss, the run's, the rollout's backend and group
size), the reward weights and scaling, and a setting whose schema condition fails for eval's config
(`--model.revision` of a local model, `--rewards.math_correct` without math_accuracy: these were silent before too).
Flags it reads are not named (hypothesis draws the flags and how eval runs). Before, every such flag was taken and
ignored without a word: `--rollout.temperature 0.5` without --sample evaluated greedily. Every key of the schema is
either read by eval or has a reason not to be."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings, strategies as st

from grpo_engine.cli import main
from grpo_engine.config import leaf_keys
from grpo_engine.tools import eval_settings, evaluate

# flag -> (value, when eval reads it: "always", "never", "sampling", "builtin", "file" or "math": while rewards.functions
# keeps math_accuracy)
FLAGS = {
    "rollout.temperature": ("0.5", "sampling"), "rollout.top_k": ("5", "sampling"), "rollout.top_p": ("0.9", "sampling"),
    "rollout.repetition_penalty": ("1.1", "always"), "rollout.max_new_tokens": ("6", "always"),
    "data.split": ("train", "never"), "data.eval_split": ("validation", "never"),
    "data.builtin_max_operand": ("2", "builtin"), "data.max_prompt_chars": ("1000", "file"),
    "data.prompt_column": ("prompt", "always"), "optim.learning_rate": ("0.1", "never"), "loss.beta": ("0.1", "never"),
    "run.seed": ("3", "always"), "run.max_steps": ("5", "never"), "rollout.num_generations": ("4", "never"),
    "model.lora.enabled": ("true", "never"), "rewards.math_correct": ("2.0", "math"),
    "rewards.answer_column": ("answer", "math"), "rewards.functions": ('["format"]', "always"),
    "model.revision": ("v2", "never"), "rewards.weights": ("[2.0]", "never"), "rewards.scale_rewards": ("none", "never"),
    "rollout.importance_sampling_cap": ("4.0", "never"),
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
                 "file": data_file, "math": "rewards.functions" not in flags}
    assert said == {flag for flag in flags if not read_when[FLAGS[flag][1]]}, (argv, said)


def test_every_key_is_read_by_eval_or_has_a_reason_not_to_be():
    """A key added to the schema is placed here: in eval_settings.READ_BY_EVAL, or given a reason it is not read."""
    keys = set(leaf_keys())
    assert set(eval_settings.READ_BY_EVAL) <= keys
    unplaced = [key for key in sorted(keys - set(eval_settings.READ_BY_EVAL))
                if eval_settings._why_unread(key, greedy=False, data_path="d.jsonl") is None]
    assert unplaced == []
