"""Reward functions that change the process around them, each a different way; loaded as `meddling_rewards:NAME`.
Every one returns 0.0 per completion: what they return is beside the point."""

import logging
import os
import random
import signal
import sys
import warnings

import numpy as np
import torch


def _zeros(completions):
    return [0.0] * len(completions)


def appends_to_columns(prompts, completions, completion_ids, tags, **kwargs):
    for row_tags in tags:
        row_tags.append("seen")
    prompts.append("extra")
    completions.clear()
    completion_ids[0].append(-1)
    return [0.0] * len(tags)


def changes_directory(prompts, completions, **kwargs):
    os.chdir("/")
    return _zeros(completions)


def sets_environment(prompts, completions, **kwargs):
    os.environ["GRPO_MEDDLED"] = "1"
    os.environ.pop("HOME", None)
    return _zeros(completions)


def installs_signal_handlers(prompts, completions, **kwargs):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *a: None)
    return _zeros(completions)


def draws_and_seeds_random_numbers(prompts, completions, **kwargs):
    random.random()
    np.random.rand(3)
    torch.rand(3)
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    return _zeros(completions)


def flips_torch_switches(prompts, completions, **kwargs):
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.set_num_threads(max(1, torch.get_num_threads() + 1))
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_anomaly_enabled(True)
    torch.set_float32_matmul_precision("medium")
    return _zeros(completions)


def replaces_streams_and_filters(prompts, completions, **kwargs):
    sys.stdout = open(os.devnull, "w")
    sys.stderr = open(os.devnull, "w")
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    sys.setrecursionlimit(sys.getrecursionlimit() + 100)
    os.umask(0o077)
    return _zeros(completions)


def meddles_and_raises(prompts, completions, **kwargs):
    os.chdir("/")
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    raise ValueError("after meddling")
