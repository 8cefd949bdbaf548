"""Warnings for runs that look healthy in the logs but cannot learn, each saying what it means.

Read from each step's logged metrics; a condition is reported when it starts (or, for zero reward spread and
completions that all run to the length limit, once it has lasted `zero_std_steps` steps, or every step of a run
shorter than that and at least SHORT_RUN_STEPS long: said at its last step) and again only after it has cleared,
so a long run is not flooded.
"""

from __future__ import annotations

import math
from typing import Optional

ZERO_STD_STEPS = 10  # "many steps" of frac_reward_zero_std = 1 before warning: single steps happen by chance
# A run shorter than that is told at its end only when every step of at least this many had it: a 1- or 2-step run
# is a smoke test of the set-up, where a step of equal rewards or cut completions says nothing of the task
SHORT_RUN_STEPS = 3
# Steps in a row in which no reward function scored any completion before the run stops: every reward is then
# 0 (TRL's nansum), so nothing is learned; one such step can be a fluke of the samples, several are a bug.
UNSCORED_STEPS = 3


# What a condition that lasts means, said once it has lasted (RunHealth._lasting)
LASTING = {
    "zero_std": (
        "frac_reward_zero_std has been 1 for {streak} steps (up to step {step}): every completion of each prompt got "
        "the same reward, so every advantage is 0 and the policy does not learn from the reward. The task is too hard "
        "or too easy for the model, or the reward does not depend on the completion; try a graded reward, more "
        "rollout.num_generations or a higher rollout.temperature."),
    "all_truncated": (
        "completions/clipped_ratio has been 1 for {streak} steps (up to step {step}): every completion ran to "
        "rollout.max_new_tokens without an end-of-sequence token: the model finished no answer, so the rewards scored "
        "cut-off text; raise rollout.max_new_tokens, or check that the tokenizer's EOS token is the one the model ends "
        "its answers with."),
}


class UnscoredRunError(RuntimeError):
    """No completion could be scored for UNSCORED_STEPS steps in a row."""


class RunHealth:
    def __init__(self, zero_std_steps: int = ZERO_STD_STEPS, unscored_steps: int = UNSCORED_STEPS) -> None:
        self.zero_std_steps, self.unscored_steps = zero_std_steps, unscored_steps
        self.unscored_streak = self.steps_seen = 0
        self.streaks: dict[str, int] = {}  # steps in a row each lasting condition has held
        self.active: set[str] = set()  # conditions already reported and not yet cleared

    def check(self, step: int, metrics: dict[str, Optional[float]], loss_tokens: Optional[float] = None,
              last: bool = False) -> list[str]:
        """Warnings for this step's metrics (empty when nothing new is wrong); raises UnscoredRunError when no
        completion could be scored for `unscored_steps` steps in a row. `loss_tokens`: the completion tokens in
        the step's loss over every process (None: not known); `last`: the run's last step."""
        messages = []
        self.steps_seen += 1
        zero_std = metrics.get("frac_reward_zero_std") == 1.0
        truncated = metrics.get("completions/clipped_ratio") == 1.0 and loss_tokens != 0  # 0: no_loss_tokens below
        for condition, holds in (("zero_std", zero_std), ("all_truncated", truncated)):
            streak = self._lasting(condition, holds, last)
            if streak:
                messages.append(LASTING[condition].format(streak=streak, step=step))
        grad_norm = metrics.get("grad_norm", 1.0)
        if self._starts("grad_nonfinite", grad_norm is None or not math.isfinite(grad_norm)):
            messages.append(
                f"grad_norm is {grad_norm} at step {step}: the gradients overflowed (a step that writes inf/NaN into "
                f"the weights stops the run). Lower optim.learning_rate, keep optim.max_grad_norm > 0, or train in "
                f"float32 (model.dtype).")
        if self._starts("no_loss_tokens", loss_tokens == 0):
            messages.append(
                f"no completion token is in the loss at step {step}: rollout.mask_truncated_completions gives every "
                f"completion truncated at rollout.max_new_tokens an all-zero loss mask, and every completion was "
                f"(completions/clipped_ratio {metrics.get('completions/clipped_ratio')}), so the step trained on "
                f"nothing; raise rollout.max_new_tokens or set rollout.mask_truncated_completions false.")
        # a completion's length counts its end-of-sequence token: 1 and not truncated is that token alone
        empty = metrics.get("completions/clipped_ratio") == 0.0 and (metrics.get("completions/max_length") or 0) <= 1
        if self._starts("all_empty", empty and "completions/max_length" in metrics):
            messages.append(
                f"every completion at step {step} is empty (completions/max_length "
                f"{metrics['completions/max_length']:g}: the model's first token was its end-of-sequence token), so "
                f"the rewards score no text; check the prompts' format (a chat model given no generation prompt, "
                f"data.max_prompt_length cutting the question off) and the model's EOS id.")
        if self._starts("grad_zero", grad_norm == 0.0 and not zero_std and loss_tokens != 0):
            messages.append(f"grad_norm is 0 at step {step} although rewards differ within groups: the update "
                            f"changed nothing. {_vanished_gradient(metrics, loss_tokens)}")
        scored = []  # per reward function: whether it scored any completion this step
        for name, value in metrics.items():
            if name.startswith("rewards/") and name.endswith("/mean"):
                function = name[len("rewards/"):-len("/mean")]
                scored.append(value is not None and not math.isnan(value))
                if self._starts(f"unscored:{function}", not scored[-1]):
                    messages.append(
                        f"reward function {function!r} returned None or NaN for every completion at step {step}: "
                        f"it scored nothing (rewards/{function}/mean is null). Completions that no function scores "
                        f"get reward 0, as in TRL; check the function's conditions and dataset columns.")
        self.unscored_streak = self.unscored_streak + 1 if scored and not any(scored) else 0
        if self.unscored_streak >= self.unscored_steps:
            raise UnscoredRunError(
                f"no completion could be scored at steps {step - self.unscored_streak + 1}-{step}: every reward "
                f"function returned None or NaN for every completion, so every reward is 0 and nothing is learned; "
                f"check the reward functions' conditions and the dataset columns they read")
        return messages

    def _lasting(self, condition: str, holds: bool, last: bool) -> int:
        """The steps in a row `condition` has held, when it is to be said now: it has lasted `zero_std_steps` steps,
        or every step of a run that ends before that many (else 0)."""
        streak = self.streaks[condition] = self.streaks.get(condition, 0) + 1 if holds else 0
        lasted = streak >= self.zero_std_steps or (last and streak == self.steps_seen >= SHORT_RUN_STEPS)
        return streak if self._starts(condition, holds and lasted) else 0

    def _starts(self, condition: str, holds: bool) -> bool:
        """True when `condition` holds now and was not already reported in its current stretch."""
        if not holds:
            self.active.discard(condition)
            return False
        if condition in self.active:
            return False
        self.active.add(condition)
        return True


def _vanished_gradient(metrics: dict[str, Optional[float]], loss_tokens: Optional[float]) -> str:
    """Why a gradient is 0 when rewards differ: with no token count known, the two causes the metrics cannot tell
    apart from a third; with tokens in the loss, the gradient vanished inside the model."""
    if loss_tokens is None:
        return ("No completion token is in the loss (all truncated with rollout.mask_truncated_completions: see "
                "completions/clipped_ratio), no parameter is trainable, or the network is saturated.")
    return (f"The loss holds {loss_tokens:g} completion tokens, so the gradient vanished inside the model: no "
            f"parameter is trainable, or the network is saturated, its output no longer depending on its weights "
            f"(entropy {metrics.get('entropy')}: a uniform output or a certain one; weights wrecked by a far too "
            f"large learning rate do this).")
