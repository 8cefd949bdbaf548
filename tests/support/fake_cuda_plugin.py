"""A pytest plugin (`-p fake_cuda_plugin`) for test_gpu_machine_collection.py: torch reports a CUDA GPU from
before the suite's conftest imports grpo_kernels, so a collection on a CPU machine marks the tests as it would
on a GPU machine. It writes each collected test's markers and skip reasons, and whether the Triton interpreter
is on, to the JSON file named by $COLLECTION_REPORT."""

import json
import os

import torch

torch.cuda.is_available = lambda: True


def pytest_collection_finish(session):
    tests = {item.nodeid: {"markers": sorted({mark.name for mark in item.iter_markers()}),
                           "skips": [mark.kwargs.get("reason", "") for mark in item.iter_markers("skip")]}
             for item in session.items}
    with open(os.environ["COLLECTION_REPORT"], "w") as report:
        json.dump({"TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"), "tests": tests}, report)
