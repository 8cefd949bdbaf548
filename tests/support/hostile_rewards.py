"""Reward functions that misbehave the way user code can, loaded by tests as `hostile_rewards:NAME`."""

import sys
import time


def exits(prompts, completions, **kwargs):
    sys.exit(0)


def hangs(prompts, completions, **kwargs):
    time.sleep(3600)


def hangs_and_swallows_exceptions(prompts, completions, **kwargs):
    while True:
        try:
            time.sleep(3600)
        except Exception:
            pass
