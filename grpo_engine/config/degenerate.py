"""Settings each valid, and valid together, under which the run cannot learn what it is set up to: said once at the
start, where the settings alone decide it (what the step's statistics decide is grpo_engine/state/health.py's).

GRPO learns only from differences between the completions of one prompt: an advantage is a completion's reward
less its group's mean. Settings that make every completion of a group score the same (a built-in reward whose
values are all equal, greedy sampling) leave every advantage 0, and a run that clips every gradient below AdamW's
epsilon scales its steps far under the learning rate; each trained for the whole run without a word. TRL accepts
all of these, so they are warnings, never refusals.
"""

from __future__ import annotations

import math
from typing import Optional

from .schema import EngineConfig


def constant_reward_reason(spec: str, config: EngineConfig) -> Optional[str]:
    """Why the built-in reward `spec` gives every completion of a prompt the same reward under these settings, or
    None when it can tell completions apart (any function the engine cannot read may)."""
    r = config.rewards
    if spec == "math_accuracy" and r.math_correct == r.math_wrong == r.math_no_answer:
        # a row without a reference answer is left out (None) for each of its completions alike
        return f"rewards.math_correct, math_wrong and math_no_answer are all {r.math_correct:g}"
    if spec == "length" and r.length_cache == 0:
        # DAPO's soft overlong penalty falls over the last length_cache tokens; a completion is never longer than
        # rollout.max_new_tokens, so with no such tokens every completion scores 0
        return "rewards.length_cache is 0, so every completion scores 0"
    return None


def constant_reward_notes(config: EngineConfig) -> list[str]:
    """A line per built-in reward that cannot tell completions apart; one line for the run when no function with a
    weight can (the weighted sum is then the same for every completion of each prompt)."""
    from ..steps.rewards import reward_names  # the names the metrics show; imported here: it imports the config

    specs = list(config.rewards.functions)
    weights = config.rewards.weights or [1.0] * len(specs)
    names = reward_names(specs)
    reasons = {name: constant_reward_reason(spec, config) for name, spec in zip(names, specs)}
    idle = {name: reason if weight else "rewards.weights gives it 0"
            for name, weight, reason in zip(names, weights, reasons.values()) if reason or not weight}
    if len(idle) == len(names):
        said = "; ".join(f"{name!r}: {reason}" for name, reason in idle.items())
        return [f"no reward function can tell the completions of a prompt apart ({said}): every completion of each "
                f"prompt gets the same reward, so every advantage is 0 and the run learns nothing from the reward"]
    return [f"reward function {name!r} gives every completion the same reward ({reason}): it changes no advantage"
            for (name, reason), weight in zip(reasons.items(), weights) if reason and weight]


def sampling_notes(config: EngineConfig) -> list[str]:
    """Sampling settings that make the completions of a prompt all the same."""
    r = config.rollout
    if r.top_k == 1:
        return [f"rollout.top_k 1 keeps only the most likely token at each step, so the rollout.num_generations "
                f"({r.num_generations}) completions of a prompt are all the same: they get the same reward (unless "
                f"a reward function is random) and every advantage is 0; set rollout.top_k 0 (off) or above 1"]
    return []


# Weight decay that alone leaves less than this share of every weight by the run's end is said: it erases the model
KEPT_BY_DECAY = 0.5


def schedule_sum(config: EngineConfig) -> float:
    """The sum over the run's optimizer steps of the learning rate's schedule factor (run_setup.lr_lambda), in closed
    form (a run may have billions of steps): a linear warmup of W steps sums to W / 2; after it, n steps sum to n
    (constant), or (n + 1) / 2 (linear, and cosine, whose cosines over a half turn sum to 1)."""
    warmup = config.warmup_steps()
    after = config.optimizer_steps() - warmup  # at least 1: warmup_ratio < 1
    return warmup / 2 + (after if config.optim.lr_scheduler_type == "constant" else (after + 1) / 2)


def optimizer_notes(config: EngineConfig) -> list[str]:
    """AdamW settings under which the gradient cannot move the weights, or the decay erases them.

    AdamW divides each clipped gradient's average by its root mean square plus epsilon: m is an average of values
    below max_grad_norm, so each step is at most max_grad_norm / adam_epsilon of the learning rate. Its decoupled
    weight decay multiplies every weight by 1 - lr x weight_decay each step, whatever the gradient: over the run
    that leaves at most exp(-weight_decay x the sum of the learning rates) (1 - x <= e^-x)."""
    o = config.optim
    notes = []
    if 0 < o.max_grad_norm < o.adam_epsilon:
        notes.append(f"optim.max_grad_norm {o.max_grad_norm:g} is below optim.adam_epsilon {o.adam_epsilon:g}: every "
                     f"gradient is clipped to a norm under AdamW's epsilon, so the gradient moves a weight by at most "
                     f"{o.max_grad_norm / o.adam_epsilon:.2g} of optim.learning_rate a step; raise "
                     f"optim.max_grad_norm (0: off) or lower optim.adam_epsilon")
    rate = o.learning_rate * o.weight_decay  # at the schedule's peak, factor 1
    kept = math.exp(-rate * schedule_sum(config))
    if rate >= 1:  # the schema refuses more than 1
        notes.append(f"optim.learning_rate {o.learning_rate:g} x optim.weight_decay {o.weight_decay:g} is {rate:g}: "
                     f"AdamW multiplies every weight by 1 - {rate:g} at a step of the full learning rate, zeroing it "
                     f"whatever the gradient; lower optim.weight_decay (TRL's default is 0)")
    elif kept < KEPT_BY_DECAY:
        notes.append(f"optim.weight_decay {o.weight_decay:g} at optim.learning_rate {o.learning_rate:g}: AdamW's "
                     f"decay alone leaves at most {kept:.2g} of each weight over the run's {config.optimizer_steps()} "
                     f"optimizer steps (each multiplies it by 1 - learning rate x weight_decay), erasing what the "
                     f"model knew; lower optim.weight_decay (TRL's default is 0)")
    return notes


def degenerate_settings(config: EngineConfig) -> list[str]:
    """One line per way these settings leave the run unable to learn, for the start of the run."""
    return constant_reward_notes(config) + sampling_notes(config) + optimizer_notes(config)
